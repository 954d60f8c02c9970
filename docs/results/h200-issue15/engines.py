"""Five engines created and closed in turn in one process: KV capacity each (before/after)."""
import gc, json, sys
from pathlib import Path
import anyio, torch
import aserve
path = "/tmp/aserve-bench/gemma3-270m"
caps = []
async def one():
    async with aserve.Engine(model=path, device="cuda", mem_fraction=0.5, max_context=2048) as e:
        await e.complete([2, 50, 60], aserve.SamplingParams(max_tokens=4, temperature=0))
        return e.info()["kv_tokens"]
for i in range(5):
    caps.append(anyio.run(one)); gc.collect()
    print(f"engine {i}: kv_tokens={caps[-1]} reserved_after_close={torch.cuda.memory_reserved()/2**30:.2f} GiB", flush=True)
print("min/first =", min(caps) / caps[0])
Path(sys.argv[1]).write_text(json.dumps({"kv_tokens": caps, "min_over_first": min(caps) / caps[0]}))

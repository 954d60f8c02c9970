"""The default model's LM head alone (Q8_0, 262,144 x 640) on aserve's CPU kernel: float32
activations (gguf_matmul) against 8-bit ones (q8_0_matmul_int8), at 1, 4 and 16 rows.

    python docs/results/cpu-int8-head/head_bench.py [threads]
"""
import time, torch, sys
from aserve.kernels import gguf_linear as G
from aserve.models.loader import load_model
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
cfg, model, _ = load_model("gemma-3-270m", torch.float32, torch.device("cpu"), gguf_blocks=True)
emb = model.model.embed_tokens
h = emb.head
print(type(emb).__name__, h.qtype, h.blocks.shape)
for m in (1, 4, 16):
    x = torch.randn(m, 640)
    for name, fn in (("float", lambda: G.gguf_matmul(x, h.blocks, h.qtype, 640)), ("int8", lambda: G.q8_0_matmul_int8(x, h.blocks, 640))):
        fn(); ts=[]
        for _ in range(5):
            t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
        print(m, name, f"{min(ts)*1e3:.1f} ms (median {sorted(ts)[2]*1e3:.1f})")
    a = G.gguf_matmul(x, h.blocks, h.qtype, 640); b = G.q8_0_matmul_int8(x, h.blocks, 640)
    print("  top1 agree", (a.argmax(-1)==b.argmax(-1)).float().mean().item(), "max rel", ((a-b).abs().max()/a.abs().max()).item())

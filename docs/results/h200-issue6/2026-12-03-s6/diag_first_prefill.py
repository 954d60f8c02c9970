"""Where does the first big prefill's 1 s launch go? Triton compiles, allocator growth, or else."""
import os, tempfile, time, sys
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tcache")
from pathlib import Path
import anyio, torch
import aserve
from loadgen.device_bench import build_checkpoint, _prompts, _run_batch

root = Path("/tmp/aserve-bench")
path = root / "gemma3-270m"
if not (path / "config.json").exists():
    build_checkpoint("gemma3-270m", root, Path(".gpu"))
cache = Path(os.environ["TRITON_CACHE_DIR"])

def comp() -> set:
    return set(cache.rglob("*.cubin"))

def ncomp() -> int:
    return len(comp())

async def main() -> None:
    print("compiled before engine", ncomp())
    async with aserve.Engine(model=str(path), device="cuda", dtype="bfloat16", max_running_requests=256,
                             max_context=1160, max_num_batched_tokens=8192, kv_cache_bytes=8 * 2**30) as e:
        print("after start (capture + warm-up)", ncomp(), "reserved GiB", torch.cuda.memory_reserved() / 2**30)
        for name, n, plen, olen in [("4x16", 4, 16, 4), ("2x64", 2, 64, 4), ("8x128", 8, 128, 4),
                                    ("64x128", 64, 128, 4), ("64x128 again", 64, 128, 4), ("64x128 sampled", 64, 128, 4)]:
            before_set = comp(); before = len(before_set); r0 = torch.cuda.memory_reserved()
            e.reset_stats()
            params = aserve.SamplingParams(max_tokens=olen, ignore_eos=True,
                                           temperature=0.7 if "sampled" in name else 0, seed=1)
            t0 = time.perf_counter()
            await _run_batch(e, _prompts(n, plen, 262144, seed=hash(name) % 1000), params)
            wall = time.perf_counter() - t0
            recs = e.step_records()
            worst = max(recs, key=lambda r: r.launch_s)
            print(f"{name:16s} wall {wall*1e3:8.1f} ms  new cubins {ncomp()-before:3d}  reserved +{(torch.cuda.memory_reserved()-r0)/2**20:7.1f} MiB"
                  f"  worst launch {worst.launch_s*1e3:8.1f} ms (step tokens {worst.num_tokens}, seqs {worst.num_seqs})", flush=True)
            new = sorted(p.name for p in comp() - before_set)
            if new:
                print("   new:", new, flush=True)
    names = sorted({p.name.split(".")[0] for p in cache.rglob("*.cubin")})
    print("kernels compiled:", names)

anyio.run(main)

"""Where does the first big prefill's 1 s launch go: Triton compiles, allocator growth, or else?

Run on the GPU machine from the repository root (round three, 2026-12-03):
    PYTHONPATH=. python docs/results/h200-issue6/2026-12-03-s6/diag_first_prefill.py
A fresh Triton cache counts the kernels compiled in each phase after start-up.
"""

import os
import tempfile

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tcache")  # before triton is imported

import time
from pathlib import Path

import anyio
import torch

import aserve
from loadgen.device_bench import _prompts, _run_batch, build_checkpoint

ROOT = Path("/tmp/aserve-bench")
PATH = ROOT / "gemma3-270m"
CACHE = Path(os.environ["TRITON_CACHE_DIR"])
PHASES = [("4x16", 4, 16), ("2x64", 2, 64), ("8x128", 8, 128), ("64x128", 64, 128), ("64x128 again", 64, 128),
          ("64x128 sampled", 64, 128)]  # fmt: skip


def compiled() -> set[Path]:
    return set(CACHE.rglob("*.cubin"))


async def main() -> None:
    print("compiled before engine", len(compiled()))
    async with aserve.Engine(model=str(PATH), device="cuda", dtype="bfloat16", max_running_requests=256,
                             max_context=1160, max_num_batched_tokens=8192, kv_cache_bytes=8 * 2**30) as e:  # fmt: skip
        print("after start (capture + warm-up)", len(compiled()), "reserved GiB", torch.cuda.memory_reserved() / 2**30)
        for k, (name, n, plen) in enumerate(PHASES):
            before = compiled()
            reserved = torch.cuda.memory_reserved()
            e.reset_stats()
            temperature = 0.7 if "sampled" in name else 0
            params = aserve.SamplingParams(max_tokens=4, ignore_eos=True, temperature=temperature, seed=1)
            t0 = time.perf_counter()
            await _run_batch(e, _prompts(n, plen, 262144, seed=k), params)
            wall = time.perf_counter() - t0
            worst = max(e.step_records(), key=lambda r: r.launch_s)
            new = sorted(p.name for p in compiled() - before)
            print(f"{name:16s} wall {wall * 1e3:8.1f} ms  new cubins {len(new):3d}  "
                  f"reserved +{(torch.cuda.memory_reserved() - reserved) / 2**20:7.1f} MiB  worst launch "
                  f"{worst.launch_s * 1e3:8.1f} ms (step tokens {worst.num_tokens}, seqs {worst.num_seqs})", flush=True)  # fmt: skip
            if new:
                print("   new:", new, flush=True)
    print("kernels compiled:", sorted({p.name.split(".")[0] for p in compiled()}))


if __name__ == "__main__":
    if not (PATH / "config.json").exists():
        build_checkpoint("gemma3-270m", ROOT, Path(".gpu"))
    anyio.run(main)

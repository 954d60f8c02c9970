"""Decode rate of one engine configuration on a CPU, for comparing settings that take effect
at process start (OpenMP's wait policy, the kernel's spin) in separate runs.

    OMP_WAIT_POLICY=ACTIVE python -m aserve.bench.decode_rate --dtype gguf

Prints one JSON line: single-stream decode tok/s of three greedy requests of ``--new`` tokens
(their median is the figure), the aggregate output tok/s of 16 concurrent streams, the wait
settings in the environment and the 1-minute load average before and after (the figures mean
little without it). docs/benchmarks.md, "Issue 20: OpenMP waits", has the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import anyio

import aserve
from aserve.bench.cpu_bench import PROMPTS  # the same prompts as the CPU benchmark


async def measure(dtype: str | None, threads: int | None, new: int, streams: bool) -> dict[str, Any]:
    params = aserve.SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
    async with aserve.Engine(model="gemma-3-270m", dtype=dtype, num_threads=threads) as engine:
        await engine.complete(PROMPTS[1], aserve.SamplingParams(max_tokens=8, temperature=0))  # warm-up
        singles = []
        for p in PROMPTS[:3]:
            r = await engine.complete(p, params)
            singles.append((new - 1) / (r.metrics["e2e_s"] - r.metrics["ttft_s"]))
        c16 = None
        if streams:
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for p in (PROMPTS * 2)[:16]:
                    tg.start_soon(engine.complete, p, params)
            c16 = 16 * new / (time.perf_counter() - t0)
        info = engine.info()
    return {"weights": info["weights"], "cpu_threads": info["cpu_threads"], "omp_wait_policy": info["omp_wait_policy"],
            "single_tok_s": [round(s, 2) for s in singles], "single_median_tok_s": round(sorted(singles)[1], 2),
            "concurrent16_tok_s": None if c16 is None else round(c16, 2)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default=None, help="the engine's dtype (default: the engine's default)")
    ap.add_argument("--threads", type=int, default=None, help="num_threads (default: the engine's choice)")
    ap.add_argument("--new", type=int, default=64, help="new tokens per request (default: %(default)s)")
    ap.add_argument("--no-streams", dest="streams", action="store_false", help="leave out the 16 streams")
    ap.add_argument("--label", default="", help="a name for the run, copied into the output")
    args = ap.parse_args()
    env = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "ASERVE_KERNEL_SPIN_US")}
    load_before = os.getloadavg()[0]
    row = anyio.run(measure, args.dtype, args.threads, args.new, args.streams)
    print(json.dumps({"label": args.label, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "env": env,
                      "new_tokens": args.new, **row, "load_1m_before": round(load_before, 2),
                      "load_1m_after": round(os.getloadavg()[0], 2)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()

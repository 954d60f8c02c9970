"""Session 20: where a constrained step's time goes at batch 256 (issue 16).

1. Host: the step loop's parts timed in the loop (the grammar advance, the mask fill, the
   upload, the sampler launch, the rest of the commit, plan, launch), per step, by wrapping
   the methods with perf_counter (a few µs of overhead a call).
2. Device: torch.profiler over the constrained run and the free run at 256: device time
   per kernel, so the sampler's part of a constrained step is seen.

Run from the repository root with PYTHONPATH=. ; --tokenizer-dir holds tokenizer.model.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import time
from pathlib import Path
from typing import Any

import aserve  # before torch
import torch

from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.bench.throughput import _TorchProfiler, run_throughput
from aserve.device.runner import ModelRunner
from aserve.engine.commit import Committer
from aserve.engine.step_loop import StepLoop
from aserve.sampling import masks

TIMES: dict[str, list[float]] = collections.defaultdict(list)


def timed(cls: Any, name: str, label: str) -> None:
    fn = getattr(cls, name)

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            TIMES[label].append(time.perf_counter() - t0)

    setattr(cls, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", default=".gpu")
    ap.add_argument("--out", default="profile_structured.json")
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    root, tok = Path("/tmp/aserve-bench"), Path(args.tokenizer_dir)
    structured = aserve.StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    b = args.batch
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "batch": b}
    timed(Committer, "advance", "advance")
    timed(Committer, "finish_commit", "finish_commit")
    # Call 2 ran this at 2752ee4 (the fill beside the commit, reverted since: MaskFiller.start,
    # PendingFill.wait and ModelRunner._copy_masks); at later commits the fill is one call.
    if hasattr(masks, "PendingFill"):
        timed(masks.MaskFiller, "start", "fill start")  # the whole fill when not in the background
        timed(masks.PendingFill, "wait", "fill wait")
        timed(ModelRunner, "_copy_masks", "mask copy")
    else:
        timed(masks.MaskFiller, "fill", "fill")
        timed(ModelRunner, "_upload_masks", "fill+upload")
    timed(ModelRunner, "launch", "launch")
    timed(ModelRunner, "prepare", "prepare")
    timed(StepLoop, "_finish_launch", "finish_launch")
    for label, st in (("free", None), ("json", structured)):
        TIMES.clear()
        r = run_throughput("gemma3-270m", root, tok, "cuda", "bfloat16", b, 128, 256, True, b, {}, structured=st)
        steps = r["steps"]
        host = {k: {"calls": len(v), "per_step_us": 1e6 * sum(v) / steps, "median_us": 1e6 * sorted(v)[len(v) // 2]}
                for k, v in TIMES.items() if v}  # fmt: skip
        print(f"{label} b={b}: {r['output_tok_s']:.0f} tok/s busy {r['device_busy_fraction']:.3f} "
              f"step_busy {r['median_step_busy_ms']:.3f} ms", flush=True)  # fmt: skip
        for k, v in host.items():
            print(f"  {k:14s} calls {v['calls']:4d}  per step {v['per_step_us']:7.1f} us  median {v['median_us']:7.1f} us")
        result[f"host_{label}"] = host
        result[f"run_{label}"] = {k: r[k] for k in ("output_tok_s", "device_busy_fraction", "median_step_busy_ms",
                                                    "host_plan_ms_per_step", "host_launch_ms_per_step",
                                                    "host_commit_ms_per_step", "split")}  # fmt: skip
    for label, st in (("free", None), ("json", structured)):
        p = _TorchProfiler()
        run_throughput("gemma3-270m", root, tok, "cuda", "bfloat16", b, 128, 64, True, b, {}, profiler=p,
                       structured=st)  # fmt: skip
        table = p.prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70)
        print(f"== kernels, {label} b={b} (64 output tokens)\n{table}", flush=True)
        result[f"kernels_{label}"] = table
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

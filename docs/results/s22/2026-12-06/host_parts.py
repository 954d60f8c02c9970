"""Session 22: where a constrained decode step's host time goes, with the grammar work beside the commit (issue 16).

The step loop's parts are timed in the loop by wrapping methods with perf_counter (a few us of
overhead a call): the grammar advance, the mask fill, the mask upload, the sampler's launch
(``_sample_cuda``: the masked argmax, the publish, the copy out), the rest of the commit, the
plan and the forward's launch; the free run beside it at the same batch. No torch profiler (it
costs more than the parts it would time). Run from the repository root with PYTHONPATH=. ;
--tokenizer-dir holds tokenizer.model.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import aserve  # before torch
import torch

from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.bench.throughput import run_throughput
from aserve.device import runner as runner_mod
from aserve.device.runner import ModelRunner
from aserve.engine.commit import Committer
from aserve.engine.step_loop import StepLoop
from aserve.sampling import masks as masks_mod
from aserve.scheduler.policy import Scheduler

TIMES: dict[str, list[float]] = collections.defaultdict(list)


def timed(owner: Any, name: str, label: str) -> None:
    if owner is None or not hasattr(owner, name):
        return  # the beside order's parts exist at 06dddfb only
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            TIMES[label].append(time.perf_counter() - t0)

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", default=".gpu")
    ap.add_argument("--out", default="host_parts.json")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out-len", type=int, default=256)
    args = ap.parse_args()
    root, tok = Path("/tmp/aserve-bench"), Path(args.tokenizer_dir)
    structured = aserve.StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "runs": []}
    timed(Committer, "advance", "advance")
    timed(Committer, "finish_commit", "finish_commit")
    timed(Committer, "commit", "commit (whole)")
    timed(runner_mod, "fill_masks", "fill")
    timed(ModelRunner, "_upload_masks", "fill+upload")
    timed(ModelRunner, "_sample_cuda", "sample_cuda")
    timed(ModelRunner, "_masked_argmax", "masked_argmax")
    timed(ModelRunner, "launch", "launch")
    timed(ModelRunner, "prepare", "prepare")
    timed(Scheduler, "schedule", "schedule")
    timed(StepLoop, "_finish_launch", "finish_launch")
    timed(Committer, "advance_beside", "advance_beside (start)")
    timed(getattr(masks_mod, "GrammarJob", None), "verdicts", "job.verdicts (loop waits)")
    timed(getattr(masks_mod, "GrammarJob", None), "wait", "job.wait (loop waits)")
    timed(masks_mod, "advance_all", "advance_all (helper)")
    timed(masks_mod, "fill_masks", "fill_masks (helper)")
    for b in (int(x) for x in args.batches.split(",")):
        for label, st in (("free", None), ("json", structured)):
            TIMES.clear()
            r = run_throughput("gemma3-270m", root, tok, args.device, args.dtype, b, 128, args.out_len, True, b, {},
                               structured=st)  # fmt: skip
            steps = r["steps"]
            host = {k: {"calls": len(v), "per_step_us": 1e6 * sum(v) / steps, "median_us": 1e6 * statistics.median(v)}
                    for k, v in TIMES.items() if v}  # fmt: skip
            print(f"{label} b={b}: {r['output_tok_s']:.0f} tok/s busy {r['device_busy_fraction']:.3f} "
                  f"step_busy {r['median_step_busy_ms']:.3f} ms plan {r['host_plan_ms_per_step']:.3f} "
                  f"launch {r['host_launch_ms_per_step']:.3f} commit {r['host_commit_ms_per_step']:.3f}", flush=True)  # fmt: skip
            for k, v in host.items():
                print(f"  {k:14s} calls {v['calls']:4d}  per step {v['per_step_us']:7.1f} us  median {v['median_us']:7.1f} us")
            result["runs"].append({"batch": b, "label": label, "host": host, **{k: r[k] for k in (
                "output_tok_s", "device_busy_fraction", "steady_decode_idle_fraction", "median_step_busy_ms",
                "host_plan_ms_per_step", "host_launch_ms_per_step", "host_commit_ms_per_step", "split")}})  # fmt: skip
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

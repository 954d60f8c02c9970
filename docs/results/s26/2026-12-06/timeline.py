"""Session 26 (session 25's, with the masks' upload and distinct_masks added): the host's
timeline of a constrained decode step at batch 256 (issue 16).

Every call of the step loop's parts is stamped (start, end, thread) by wrapping the methods
with perf_counter; each step is anchored at its commit's grammar advance (``advance_beside``
with the grammar work beside the commit, ``advance`` with the two-part commit), and every
part's first call after the anchor is placed on that step's timeline (us from the anchor).
The medians over the steady steps print as a table, with the device's idle per step from
the engine's step records. Run from the repository root with PYTHONPATH=. ; ASERVE_GRAMMAR_BESIDE
picks the order at 06dddfb (the beside order, reverted after; at later commits the parts it
does not find are left out). JSON to --out."""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import aserve  # before torch
import torch

from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.bench.throughput import run_throughput
from aserve.device import runner as runner_mod
from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.runner import ModelRunner
from aserve.engine.commit import Committer
from aserve.engine.step_loop import StepLoop
from aserve.sampling import masks as masks_mod
from aserve.scheduler.policy import Scheduler

STAMPS: list[tuple[str, float, float, str]] = []


def timed(owner: Any, name: str, label: str) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            STAMPS.append((label, t0, time.perf_counter(), threading.current_thread().name))

    setattr(owner, name, wrapper)


PARTS = [
    (Committer, "advance_beside", "start job (loop)"),
    (Committer, "advance", "advance (loop)"),
    (masks_mod, "advance_all", "advance_all"),
    (getattr(masks_mod, "GrammarJob", None), "verdicts", "wait verdicts (loop)"),
    (masks_mod, "fill_masks", "fill (helper)"),
    (getattr(masks_mod, "MaskFill", None), "compute", "fill compute"),
    (getattr(masks_mod, "FillBeside", None), "run", "fill beside + commit rest (loop)"),
    (runner_mod, "fill_masks", "fill (loop)"),
    (Committer, "finish_commit", "finish_commit (loop)"),
    (getattr(masks_mod, "GrammarJob", None), "wait", "wait fill (loop)"),
    (DecodeGraphs, "upload_masks", "masks upload (loop)"),
    (masks_mod, "distinct_masks", "distinct masks (loop)"),
    (StepLoop, "_finish_launch", "sampler launch (loop)"),
    (ModelRunner, "_masked_argmax", "masked argmax launch"),
    (ModelRunner, "launch", "forward launch (loop)"),
    (Scheduler, "schedule", "schedule (loop)"),
    (ModelRunner, "prepare", "prepare (loop)"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", default=".gpu")
    ap.add_argument("--out", default="timeline.json")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out-len", type=int, default=256)
    args = ap.parse_args()
    for owner, name, label in PARTS:
        if owner is not None and hasattr(owner, name):  # the beside order's parts exist at 06dddfb only
            timed(owner, name, label)
    root, tok = Path("/tmp/aserve-bench"), Path(args.tokenizer_dir)
    structured = aserve.StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    r = run_throughput("gemma3-270m", root, tok, args.device, args.dtype, args.batch, 128, args.out_len, True,
                       args.batch, {}, structured=structured)  # fmt: skip
    anchors = [s for s in STAMPS if s[0] in ("start job (loop)", "advance (loop)")]
    anchors = anchors[len(anchors) // 4 : 3 * len(anchors) // 4]  # the steady middle
    table: dict[str, dict[str, float]] = {}
    stamps = sorted(STAMPS, key=lambda s: s[1])
    starts = [s[1] for s in stamps]
    import bisect

    for a in anchors:
        seen: set[str] = set()
        k = bisect.bisect_left(starts, a[1])
        nxt = next((s[1] for s in stamps[k + 1 :] if s[0] == a[0]), None)
        for s in stamps[k:]:
            if nxt is not None and s[1] >= nxt:
                break
            if s[0] in seen:
                continue
            seen.add(s[0])
            row = table.setdefault(s[0], {"start": [], "end": [], "thread": s[3]})  # type: ignore[dict-item]
            row["start"].append((s[1] - a[1]) * 1e6)  # type: ignore[attr-defined]
            row["end"].append((s[2] - a[1]) * 1e6)  # type: ignore[attr-defined]
        if nxt is not None:
            table.setdefault("next anchor", {"start": [], "end": [], "thread": ""})["start"].append((nxt - a[1]) * 1e6)  # type: ignore[attr-defined]
    out = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "batch": args.batch,
           "steps": len(anchors), "output_tok_s": r["output_tok_s"], "device_busy_fraction": r["device_busy_fraction"],
           "median_step_busy_ms": r["median_step_busy_ms"], "split": r["split"], "parts": {}}  # fmt: skip
    print(f"b={args.batch}: {r['output_tok_s']:.0f} tok/s busy {r['device_busy_fraction']:.3f} "
          f"step_busy {r['median_step_busy_ms']:.3f} ms; {len(anchors)} steps; us from the anchor (median):")
    for label, row in sorted(table.items(), key=lambda kv: statistics.median(kv[1]["start"])):
        st = statistics.median(row["start"])  # type: ignore[arg-type]
        en = statistics.median(row["end"]) if row["end"] else st  # type: ignore[arg-type]
        out["parts"][label] = {"start_us": st, "end_us": en, "n": len(row["start"]), "thread": row["thread"]}
        print(f"  {label:26s} {st:8.0f} -> {en:8.0f}  ({en - st:6.0f})  n={len(row['start'])}  {row['thread']}")
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""Session 26 (issue 16; session 25's script with upload_masks's new arguments passed through):
how long a split step's masks' upload takes inside a constrained run (now the host's search
for the distinct masks, then their copy), and from its start to the tokens on the device.

``DecodeGraphs.upload_masks`` and ``masked_argmax`` are wrapped to record timing CUDA events:
before and after the copy (on the schedule stream) and after the replay (on the forward
stream). Session 25's profile charged ~730 us a step to pinned-to-device copies at 256 rows,
against 185 us for the same 8 MiB copied alone: if the copy is that slow in the run, it sits
on the host's chain (sampler launched -> copy -> argmax -> tokens back -> the next advance).

    PYTHONPATH=$PWD python upload_events.py --tokenizer-dir .gpu --batch 256 --out upload256.json
"""

import argparse
import json
import statistics
from pathlib import Path

import aserve  # noqa: F401  (before torch)
import torch

from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.bench.throughput import run_throughput
from aserve.device.decode_graphs import DecodeGraphs

marks: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []  # (rows, before copy, after copy)
ends: list[torch.cuda.Event] = []  # after each replay
upload, replay = DecodeGraphs.upload_masks, DecodeGraphs.masked_argmax


def timed_upload(self: DecodeGraphs, size: int, *rest: int) -> None:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    upload(self, size, *rest)
    b.record()
    marks.append((size, a, b))


def timed_replay(self: DecodeGraphs, size: int) -> None:
    replay(self, size)
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    ends.append(e)


DecodeGraphs.upload_masks = timed_upload  # type: ignore[method-assign]
DecodeGraphs.masked_argmax = timed_replay  # type: ignore[method-assign]

ap = argparse.ArgumentParser()
ap.add_argument("--tokenizer-dir", default=".gpu")
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--out", required=True)
args = ap.parse_args()
r = run_throughput("gemma3-270m", Path("/tmp/aserve-bench"), Path(args.tokenizer_dir), "cuda", "bfloat16",
                   args.batch, 128, 256, True, args.batch, {},
                   structured=aserve.StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA))  # fmt: skip
torch.cuda.synchronize()
full = [(a.elapsed_time(b) * 1e3, a.elapsed_time(e) * 1e3) for (size, a, b), e in zip(marks, ends)
        if size == args.batch]  # fmt: skip
steady = full[len(full) // 4 : 3 * len(full) // 4]
copy_us = statistics.median(c for c, _ in steady)
to_tokens_us = statistics.median(t for _, t in steady)
print(f"b={args.batch}: {r['output_tok_s']:.0f} tok/s, busy {r['device_busy_fraction']:.1%}, step busy "
      f"{r['median_step_busy_ms']:.2f} ms; {len(steady)} steady split steps: the masks' copy {copy_us:.0f} us, "
      f"copy start to the replay's end {to_tokens_us:.0f} us (medians)")
Path(args.out).write_text(json.dumps({"run": {k: v for k, v in r.items() if not isinstance(v, (list, dict))},
                                      "copy_us": copy_us, "to_tokens_us": to_tokens_us,
                                      "pairs_us": full}, indent=1))  # fmt: skip

"""Session 24: where a constrained step's extra device time goes. torch.profiler (CUDA
activity) over the structured bench's run at one batch (Gemma 3 270M shape, random weights,
bf16, the 200-integer array schema, greedy), free and constrained: device time per kernel
and copy, summed, with the run's step count to divide by.

    python device_profile.py --tokenizer-dir .gpu --batch 256 --out profile.json
"""

import argparse
import json
from pathlib import Path

import aserve  # noqa: F401  (before torch)
import torch
from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.bench.throughput import _TorchProfiler, run_throughput

ap = argparse.ArgumentParser()
ap.add_argument("--tokenizer-dir", required=True)
ap.add_argument("--work-dir", default="/tmp/aserve-bench")
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--out", required=True)
args = ap.parse_args()
root, tok = Path(args.work_dir), Path(args.tokenizer_dir)
out = {}
for label, so in (("free", None), ("json_schema", aserve.StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA))):
    p = _TorchProfiler()
    r = run_throughput("gemma3-270m", root, tok, "cuda", "bfloat16", args.batch, 128, 128, True, args.batch, {},
                       profiler=p, structured=so)
    rows = []
    for e in p.prof.key_averages():
        dev = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if dev > 0:
            rows.append((dev, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(d for d, _, _ in rows)
    print(f"== {label}: {r['output_tok_s']:.0f} tok/s, {r['steps']} steps, busy {r['device_busy_fraction']:.1%}, "
          f"median step busy {r.get('median_step_busy_ms', 0):.3f} ms; device time {total / 1e3:.1f} ms "
          f"= {total / r['steps']:.0f} us a step")
    for dev, count, key in rows[:22]:
        print(f"{dev / r['steps']:9.1f} us/step {count:7d}x  {key[:90]}")
    out[label] = {"run": {k: v for k, v in r.items() if not isinstance(v, (list, dict))},
                  "kernels": [{"device_us": d, "count": c, "name": k} for d, c, k in rows[:60]]}
    del p
    torch.cuda.empty_cache()
Path(args.out).write_text(json.dumps(out, indent=1))

# The masks' copy alone: 256 rows x 32 KiB (262,144 tokens) from pinned memory, CUDA events.
src = torch.zeros(args.batch, 8192, dtype=torch.int32, pin_memory=True)
dst = torch.empty(args.batch, 8192, dtype=torch.int32, device="cuda")
s = torch.cuda.Stream()
times = []
with torch.cuda.stream(s):
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
times.sort()
mib = src.numel() * 4 / 2**20
print(f"masks H2D {mib:.0f} MiB: median {times[15]:.0f} us ({mib * 2**20 / times[15] / 1e3:.1f} GB/s)")
out["masks_h2d_us"] = times[15]
Path(args.out).write_text(json.dumps(out, indent=1))

# The same copy split over 2 and 4 streams (copy engines may work side by side).
for parts in (2, 4):
    streams = [torch.cuda.Stream() for _ in range(parts)]
    rows = args.batch // parts
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for k, st in enumerate(streams):
            st.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(st):
                dst[k * rows:(k + 1) * rows].copy_(src[k * rows:(k + 1) * rows], non_blocking=True)
        for st in streams:
            torch.cuda.current_stream().wait_stream(st)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    print(f"masks H2D over {parts} streams: median {times[15]:.0f} us ({mib * 2**20 / times[15] / 1e3:.1f} GB/s)")
    out[f"masks_h2d_{parts}_streams_us"] = times[15]
Path(args.out).write_text(json.dumps(out, indent=1))

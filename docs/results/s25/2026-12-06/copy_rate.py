"""Session 25: the masks' host-to-device copy alone (pinned int32 [rows, 8192]: 32 KiB a row, a
262,144-token vocabulary), timed with CUDA events at 64 and 256 rows, on one stream and split
over 2 and 4, and beside a busy device (a bf16 GEMM loop on another stream). Prints a table.

    python copy_rate.py --out copy_rate.json
"""

import argparse
import json
from pathlib import Path

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
res: dict[str, float] = {}


def timed(fn, n: int = 30) -> float:
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[n // 2]


for rows in (64, 256):
    src = torch.zeros(rows, 8192, dtype=torch.int32, pin_memory=True)
    dst = torch.empty(rows, 8192, dtype=torch.int32, device="cuda")
    mib = src.numel() * 4 / 2**20
    for parts in (1, 2, 4):
        streams = [torch.cuda.Stream() for _ in range(parts)]
        k_rows = rows // parts

        def copy() -> None:
            here = torch.cuda.current_stream()
            for k, st in enumerate(streams):
                st.wait_stream(here)
                with torch.cuda.stream(st):
                    dst[k * k_rows:(k + 1) * k_rows].copy_(src[k * k_rows:(k + 1) * k_rows], non_blocking=True)
            for st in streams:
                here.wait_stream(st)

        us = timed(copy)
        res[f"rows{rows}_streams{parts}_us"] = us
        print(f"{rows:4d} rows ({mib:.0f} MiB) over {parts} stream(s): {us:7.0f} us  {mib * 2**20 / us / 1e3:6.1f} GB/s")
    # Beside a busy device: bf16 GEMMs on another stream while the copy runs.
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    busy = torch.cuda.Stream()

    def copy_beside() -> None:
        busy.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(busy):
            for _ in range(8):
                a @ a
        dst.copy_(src, non_blocking=True)

    t_copy = timed(lambda: dst.copy_(src, non_blocking=True))

    us = timed(copy_beside)
    torch.cuda.current_stream().wait_stream(busy)
    torch.cuda.synchronize()
    res[f"rows{rows}_beside_gemms_us"] = us
    print(f"{rows:4d} rows beside GEMMs on another stream: copy stream's span {us:7.0f} us (alone {t_copy:.0f})")
Path(args.out).write_text(json.dumps(res, indent=1))

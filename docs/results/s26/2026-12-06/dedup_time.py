"""Session 26 (issue 16): what aserve.sampling.masks.distinct_masks costs on this host, on
pinned rows like the device bench's (4 distinct sparse masks of 8,192 words, rows shuffled),
written just before (as the fill writes them), at 64 and 256 rows on 1, 4 and 8 threads.

    PYTHONPATH=$PWD python dedup_time.py --out dedup_time.json
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import aserve  # noqa: F401  (before torch)
import torch

PIN = torch.cuda.is_available()

from aserve.sampling.masks import distinct_masks

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
words = 8192
g = torch.Generator().manual_seed(0)
base = torch.zeros(4, words, dtype=torch.int32)
for i in range(4):
    base[i, torch.randint(0, words, (4,), generator=g)] = torch.randint(1, 2**31 - 1, (4,), generator=g, dtype=torch.int32)
res = []
for rows in (64, 256):
    src = base[torch.randint(0, 4, (rows,), generator=g)].contiguous()
    host = torch.empty(rows, words, dtype=torch.int32, pin_memory=PIN)
    out = torch.empty(64, words, dtype=torch.int32, pin_memory=PIN)
    index = torch.empty(rows, dtype=torch.int32, pin_memory=PIN)
    for threads in (1, 4, 8):
        ts = []
        for _ in range(60):
            host.copy_(src)  # written just before, as the fill leaves it
            t = time.perf_counter()
            n = distinct_masks(host, out, index, threads)
            ts.append(time.perf_counter() - t)
            time.sleep(0.002)  # a device step apart: the pool's helpers go to sleep
        us = statistics.median(ts[10:]) * 1e6
        res.append({"rows": rows, "threads": threads, "distinct": n, "median_us": us, "min_us": min(ts) * 1e6})
        print(f"rows {rows} threads {threads}: {n} distinct, median {us:.0f} us, min {min(ts) * 1e6:.0f} us")
Path(args.out).write_text(json.dumps(res, indent=1))

"""Session 26 (issue 16, for the next session): can a stream wait on the device for a flag the
host writes into pinned memory (cuStreamWaitValue32), and how soon after the write does work
queued behind the wait finish?

If it can, a split step's sampler and the next forward could be queued at launch, behind a wait
on a per-step flag, and the host's chain after the mask fill would shrink to one store (the
sampler's and the forward's launches, ~0.35 ms at 256 rows on the H100 hosts, leave it).

Prints: the driver call's return codes, whether work behind the wait stays queued while the
flag is 0, and the medians of (host store -> a tiny kernel behind the wait done, seen by the
host) and of (issuing the wait) over 50 tries. JSON to --out.

    python wait_value_probe.py --out wait_value.json
"""

import argparse
import ctypes
import json
import statistics
import time
from pathlib import Path

import torch

CU_STREAM_WAIT_VALUE_EQ = 0x1

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
cuda = ctypes.CDLL("libcuda.so.1")
wait = getattr(cuda, "cuStreamWaitValue32_v2", None) or cuda.cuStreamWaitValue32
wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
res: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "fn": wait.__name__}
torch.cuda.init()
flags = torch.zeros(64, dtype=torch.int32).pin_memory()
dptr = ctypes.c_uint64()
res["host_get_device_pointer_rc"] = cuda.cuMemHostGetDevicePointer_v2(
    ctypes.byref(dptr), ctypes.c_void_p(flags.data_ptr()), 0
)
res["same_address"] = dptr.value == flags.data_ptr()
s = torch.cuda.Stream()
x = torch.zeros(16, device="cuda")
lat, issue, rcs, queued = [], [], set(), []
for i in range(1, 51):
    slot = i % 64
    flags[slot] = 0
    with torch.cuda.stream(s):
        t0 = time.perf_counter()
        rc = wait(ctypes.c_void_p(s.cuda_stream), dptr.value + 4 * slot, 1, CU_STREAM_WAIT_VALUE_EQ)
        issue.append(time.perf_counter() - t0)
        rcs.add(rc)
        x.add_(1)
        ev = torch.cuda.Event()
        ev.record()
    time.sleep(0.002)
    queued.append(not ev.query())  # still waiting for the flag
    t0 = time.perf_counter()
    flags[slot] = 1
    ev.synchronize()
    lat.append(time.perf_counter() - t0)
res.update({"wait_rcs": sorted(rcs), "queued_while_zero": sum(queued), "tries": len(queued),
            "store_to_done_us_median": statistics.median(lat) * 1e6, "store_to_done_us_max": max(lat) * 1e6,
            "issue_us_median": statistics.median(issue) * 1e6, "x": float(x[0])})  # fmt: skip
print(res)
Path(args.out).write_text(json.dumps(res, indent=1))

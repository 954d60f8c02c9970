"""Session 24 probe: a stream that waits on a host flag in the GPU's front end
(cuStreamWaitValue32 through ctypes on libcuda), no spinning kernel.

Prints whether the driver has the call, that work behind the wait does not run before the
flag is stored (and then does), the copy of pinned data stored just before the flag, and the
release latency: host store of the flag -> the event behind the wait seen done by a host poll,
against the same poll on work enqueued with no wait (the poll's own floor)."""

import ctypes
import json
import statistics
import sys
import time

import torch

lib = ctypes.CDLL("libcuda.so.1")
fn = None
for name in ("cuStreamWaitValue32_v2", "cuStreamWaitValue32"):
    try:
        fn = getattr(lib, name)
        print("symbol", name)
        break
    except AttributeError:
        continue
assert fn is not None, "no cuStreamWaitValue32 in libcuda"
fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
fn.restype = ctypes.c_int
GEQ = 0x0

torch.cuda.init()
dev = torch.device("cuda")
flag = torch.zeros(16, dtype=torch.int32, pin_memory=True)
addr = flag.data_ptr()
stream = torch.cuda.Stream()
x = torch.zeros(1024, device=dev)
src = torch.zeros(1 << 20, dtype=torch.uint8, pin_memory=True)
dst = torch.empty(1 << 20, dtype=torch.uint8, device=dev)


def wait(value: int) -> None:
    rc = fn(ctypes.c_void_p(stream.cuda_stream), addr, value, GEQ)
    assert rc == 0, f"cuStreamWaitValue32 returned {rc}"


out = {}
# 1. Work behind the wait waits for the store.
with torch.cuda.stream(stream):
    wait(1)
    x.add_(1)
    dst.copy_(src, non_blocking=True)
    ev = torch.cuda.Event()
    ev.record()
time.sleep(0.05)
held = not ev.query()
src.fill_(7)
flag[0] = 1
ev.synchronize()
out["held_before_store"] = held
out["copy_saw_data_stored_before_flag"] = bool((dst == 7).all().item())
print("held before store:", held, "copy saw data:", out["copy_saw_data_stored_before_flag"])


def poll(ev: torch.cuda.Event) -> float:
    t0 = time.perf_counter()
    while not ev.query():
        pass
    return (time.perf_counter() - t0) * 1e6


# 2. Release latency against the poll floor, the device idle before each.
rel, floor = [], []
for k in range(2, 402):
    with torch.cuda.stream(stream):
        wait(k)
        x.add_(1)
        ev = torch.cuda.Event()
        ev.record()
    time.sleep(0.0005)
    flag[0] = k
    rel.append(poll(ev))
    with torch.cuda.stream(stream):
        x.add_(1)
        ev = torch.cuda.Event()
        ev.record()
    floor.append(poll(ev))


def q(v):
    v = sorted(v)
    return {"p50": round(statistics.median(v), 1), "p90": round(v[int(0.9 * len(v))], 1), "max": round(v[-1], 1)}


out["release_us"], out["floor_us"] = q(rel), q(floor)
print("release us", out["release_us"], "floor us", out["floor_us"])

# 3. The wait behind a long kernel: stored while the kernel runs, released when it ends.
big = torch.randn(8192, 8192, device=dev)
rel2 = []
k = 1000
for _ in range(50):
    k += 1
    with torch.cuda.stream(stream):
        for _ in range(3):
            big @ big
        wait(k)
        x.add_(1)
        ev = torch.cuda.Event()
        ev.record()
    flag[0] = k  # stored at once: the wait must not cost more than nothing
    t0 = time.perf_counter()
    ev.synchronize()
    rel2.append((time.perf_counter() - t0) * 1e6)
with torch.cuda.stream(stream):
    ev0 = torch.cuda.Event(enable_timing=True)
    ev1 = torch.cuda.Event(enable_timing=True)
    ev0.record()
    for _ in range(3):
        big @ big
    ev1.record()
ev1.synchronize()
out["behind_matmuls_us"] = q(rel2)
out["matmuls_alone_us"] = round(ev0.elapsed_time(ev1) * 1e3, 1)
print("behind 3 matmuls (stored before):", out["behind_matmuls_us"], "matmuls alone", out["matmuls_alone_us"])
json.dump(out, open(sys.argv[1], "w"), indent=1)

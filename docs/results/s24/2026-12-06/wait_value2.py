"""Session 24 probe 2: call 1's stream wait on a torch-pinned flag never released. Each variant
here gets its own stream and a 2 s deadline (polled), so one that hangs is reported, not waited on:
A torch pinned flag; B cuMemHostAlloc(DEVICEMAP) + cuMemHostGetDevicePointer; C a device flag
released by cuStreamWriteValue32 on another stream; D a torch-pinned flag registered again through
cuMemHostGetDevicePointer; E a Triton-free check: a device copy of the pinned flag (does the GPU see
the store at all?). Ends with os._exit: a stream left waiting must not hang the exit."""

import ctypes
import os
import statistics
import time

import torch

lib = ctypes.CDLL("libcuda.so.1")
wait_fn = lib.cuStreamWaitValue32_v2
wait_fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
write_fn = lib.cuStreamWriteValue32_v2
write_fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
torch.cuda.init()
torch.zeros(1, device="cuda")
dev_id = ctypes.c_int()
assert lib.cuCtxGetDevice(ctypes.byref(dev_id)) == 0
for attr, name in [(91, "HOST_PTR_FOR_REGISTERED_MEM"), (92, "STREAM_MEM_OPS_V1"), (93, "64BIT_MEM_OPS_V1"),
                   (94, "WAIT_VALUE_NOR_V1"), (98, "CAN_FLUSH_REMOTE_WRITES"), (41, "UNIFIED_ADDRESSING"),
                   (19, "CAN_MAP_HOST_MEMORY")]:
    v = ctypes.c_int()
    rc = lib.cuDeviceGetAttribute(ctypes.byref(v), attr, dev_id.value)
    print(f"attr {name} ({attr}) = {v.value} rc={rc}")
x = torch.zeros(1024, device="cuda")


def trial(label, addr, store, flags=0, n=200):
    s = torch.cuda.Stream()
    lat = []
    for k in range(1, n + 1):
        with torch.cuda.stream(s):
            rc = wait_fn(ctypes.c_void_p(s.cuda_stream), addr, k, flags)
            assert rc == 0, rc
            x.add_(1)
            ev = torch.cuda.Event()
            ev.record()
        if k == 1:
            time.sleep(0.02)
            if ev.query():
                print(label, "NOT HELD: the work ran before the store")
                return
        else:
            time.sleep(0.0003)
        t0 = time.perf_counter()
        store(k)
        while not ev.query():
            if time.perf_counter() - t0 > 2.0:
                print(label, f"HUNG at k={k}: the store was not seen in 2 s")
                return
        lat.append((time.perf_counter() - t0) * 1e6)
    lat.sort()
    print(label, f"ok: release p50 {statistics.median(lat):.1f} us p90 {lat[int(0.9 * len(lat))]:.1f} max {lat[-1]:.1f}")


# A: torch pinned
fa = torch.zeros(16, dtype=torch.int32, pin_memory=True)
def sa(k): fa[0] = k
trial("A torch-pinned", fa.data_ptr(), sa, n=20)
# A2: torch pinned with FLUSH flag
fa2 = torch.zeros(16, dtype=torch.int32, pin_memory=True)
def sa2(k): fa2[0] = k
trial("A2 torch-pinned+FLUSH", fa2.data_ptr(), sa2, flags=1 << 30, n=20)
# B: cuMemHostAlloc DEVICEMAP|PORTABLE
hp = ctypes.c_void_p()
rc = lib.cuMemHostAlloc(ctypes.byref(hp), ctypes.c_size_t(64), ctypes.c_uint(0x02 | 0x01))
dp = ctypes.c_uint64()
rc2 = lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dp), hp, 0)
print("B alloc rc", rc, rc2, "host", hex(hp.value or 0), "dev", hex(dp.value))
arr = (ctypes.c_uint32 * 16).from_address(hp.value)
def sb(k): arr[0] = k
trial("B cuMemHostAlloc", dp.value, sb)
# D: device pointer of the torch pinned buffer
dp2 = ctypes.c_uint64()
rc3 = lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dp2), ctypes.c_void_p(fa.data_ptr()), 0)
print("D torch pinned: host", hex(fa.data_ptr()), "dev", hex(dp2.value), "rc", rc3)
# C: device flag, released by a stream write on another stream
fc = torch.zeros(16, dtype=torch.int32, device="cuda")
s2 = torch.cuda.Stream()
def sc(k): assert write_fn(ctypes.c_void_p(s2.cuda_stream), fc.data_ptr(), k, 0) == 0
trial("C device flag + stream write", fc.data_ptr(), sc)
# E: does the GPU see a pinned store? copy it
fa[1] = 1234
print("E device copy of pinned:", fa.to("cuda", non_blocking=True)[1].item())
print("done")
os._exit(0)

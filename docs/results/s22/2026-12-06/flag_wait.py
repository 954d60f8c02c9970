"""Session 22: is a device-side wait on a host-set flag a sound base for the split step?

NOT YET RUN: written at the end of session 22, whose device time ran out before ``call6.sh``
could run it. Its Triton spin kernel and the pinned-memory pointers are untried on a device.

The idea (issue 16): enqueue a split step's sampler and the next forward before the masks are
filled, behind a kernel that spins until the host writes the step's number into pinned memory;
the host's chain after the fill is then one store. Measured on the device, nothing of the engine
used:

1. release latency: a one-program Triton kernel spins on a volatile load of a pinned int32 (the
   GPU reads host memory over PCIe); an event after it; the host sleeps, stores the flag and
   polls the event: the time from the store to the event's completion, seen by the host;
2. the masked argmax (aserve.kernels.bitmask) over 256 rows of a 262,144 vocabulary reading its
   masks from device memory, against reading them from pinned host memory (zero copy), against
   the 8 MiB copy of the masks plus the kernel on device memory: device time, CUDA events,
   20 launches each, median of 5.

Prints a table; JSON to --out."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import aserve  # noqa: F401  (before torch)
import torch
import triton
import triton.language as tl

from aserve.kernels.bitmask import masked_argmax_


class HostPtr:
    """A pinned host tensor's address as Triton takes a pointer (mapped: UVA)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t, self.dtype = t, t.dtype

    def data_ptr(self) -> int:
        return self.t.data_ptr()


@triton.jit
def _spin(flag, target, out):
    seen = tl.load(flag, volatile=True)
    n = 0
    while seen < target:
        seen = tl.load(flag, volatile=True)
        n += 1
    tl.store(out, n)


def release_latency(rounds: int, sleep_s: float) -> dict[str, float]:
    flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    lat = []
    for k in range(1, rounds + 1):
        done = torch.cuda.Event()
        with torch.cuda.stream(s):
            _spin[(1,)](HostPtr(flag), k, out)
            done.record(s)
        time.sleep(sleep_s)
        assert not done.query(), "the kernel did not wait for the flag"
        t0 = time.perf_counter()
        flag[0] = k
        while not done.query():
            pass
        lat.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return {"median_us": statistics.median(lat) * 1e6, "max_us": max(lat) * 1e6, "spins_last": int(out.item())}


def argmax_times(rows: int, vocab: int) -> dict[str, float]:
    words = (vocab + 31) // 32
    logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    host_bits = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=gen).pin_memory()
    dev_bits = host_bits.to("cuda")
    idx = torch.arange(rows, device="cuda")
    out = torch.zeros(rows, dtype=torch.int64, device="cuda")

    class HostBits(HostPtr):
        def stride(self, i: int) -> int:
            return self.t.stride(i)

        @property
        def shape(self) -> torch.Size:
            return self.t.shape

    def timed(fn: object, n: int = 20) -> float:
        res = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(n):
                fn()  # type: ignore[operator]
            b.record()
            b.synchronize()
            res.append(a.elapsed_time(b) * 1e3 / n)
        return statistics.median(res)

    masked_argmax_(out, logits, idx, dev_bits)
    want = out.clone()
    masked_argmax_(out.zero_(), logits, idx, HostBits(host_bits))  # type: ignore[arg-type]
    torch.cuda.synchronize()
    same = bool(torch.equal(out, want))
    return {
        "device_bits_us": timed(lambda: masked_argmax_(out, logits, idx, dev_bits)),
        "pinned_bits_us": timed(lambda: masked_argmax_(out, logits, idx, HostBits(host_bits))),  # type: ignore[arg-type]
        "copy_then_kernel_us": timed(lambda: masked_argmax_(out, logits, idx, host_bits.to("cuda", non_blocking=True))),
        "copy_alone_us": timed(lambda: dev_bits.copy_(host_bits, non_blocking=True)),
        "pinned_same_tokens": same,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="flag_wait.json")
    args = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "release": release_latency(50, 0.002)}
    for rows in (64, 256):
        res[f"argmax_{rows}"] = argmax_times(rows, 262144)
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()

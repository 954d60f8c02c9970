"""A device-side gate the host opens: one program that spins on a word of pinned host memory.

Work queued on a stream behind :func:`gate_` runs once the host has counted ``opened`` up to
the gate's turn. The gates on a stream pass in order: ``passed`` (device memory) counts those
that have, so the kernel takes no per-gate argument and one CUDA graph of it serves every turn
(a replay costs the host ~10 us against a Triton launch's ~50). The host's store reaches the
spinning program over PCIe: session 23 saw it released a median 47 us after the store
(docs/benchmarks.md). ``cuStreamWaitValue32``, the driver's own wait, hung on the device hosts
(session 24: their driver reports ``CAN_USE_STREAM_MEM_OPS_V1 = 0``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gate(opened, passed):
    turn = tl.load(passed) + 1
    seen = tl.load(opened, volatile=True)
    while seen < turn:
        seen = tl.load(opened, volatile=True)
    tl.store(passed, turn)


class _Pinned:
    """A pinned host tensor as Triton takes a pointer (its address is valid on the device: UVA)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t, self.dtype = t, t.dtype

    def data_ptr(self) -> int:
        return self.t.data_ptr()


def gate_(opened: torch.Tensor, passed: torch.Tensor) -> None:
    """Queue a gate on the current stream: it passes once ``opened[0]`` (pinned host int64) is
    at least the number of gates queued on ``passed`` (a device int64) so far, itself included."""
    _gate[(1,)](_Pinned(opened), passed, num_warps=1)

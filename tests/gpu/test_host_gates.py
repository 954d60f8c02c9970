"""The host gates on CUDA (aserve/device/host_gates.py): work queued behind a gate waits for the
host to open it, gates pass in the order they were shut, and ``open_all`` frees every stream.
Real CUDA streams, a real spinning kernel; skipped without a GPU."""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _settle(event: torch.cuda.Event, seconds: float = 5.0) -> bool:
    """Whether ``event`` completes within ``seconds`` (polled, no blocking sync)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if event.query():
            return True
        time.sleep(0.001)
    return event.query()


def test_work_behind_a_gate_runs_once_the_host_opens_it_in_turn() -> None:
    from aserve.device.host_gates import HostGates

    gates = HostGates(torch.device("cuda"))
    stream = torch.cuda.Stream()
    src = torch.arange(1, 9, dtype=torch.int32, pin_memory=True)
    dst = torch.zeros(8, dtype=torch.int32, device="cuda")
    opens, dones = [], []
    for k in range(3):  # three gates, each with a copy of its own word behind it
        opens.append(gates.shut(k, stream))
        with torch.cuda.stream(stream):
            dst[k].copy_(src[k], non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        dones.append(done)
    assert gates.shut_count == 3
    time.sleep(0.05)
    assert not any(d.query() for d in dones), "work ran behind a shut gate"
    opens[0]()
    assert _settle(dones[0]) and not dones[1].query()
    opens[0]()  # opening twice is a no-op
    opens[1]()
    assert _settle(dones[1]) and not dones[2].query()
    gates.open_all()  # the last one, as at close or on failure
    assert _settle(dones[2]) and gates.shut_count == 0
    torch.cuda.synchronize()
    assert dst[:3].tolist() == [1, 2, 3]

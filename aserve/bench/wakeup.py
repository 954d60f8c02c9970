"""The ``wake`` section: ways to await a CUDA event from the event loop, compared (CUDA only)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import anyio
import anyio.lowlevel
import torch


def bench_wakeup(waits: int = 40, sleep_cycles: int = 2_700_000) -> list[dict[str, Any]]:
    """Wake-up latency and CPU cost of three ways to await a CUDA event from the event loop.

    A spinning helper thread timestamps the moment each event completes (``query()`` in a
    tight loop); the awaiting coroutine timestamps when it resumes. CPU cost is process CPU
    time (all threads, the spinner excluded by running it only in a calibration pass).
    The GPU sleep is not a whole number of milliseconds (about 1.35 ms on the H200), so a
    timer that only fired on millisecond ticks could not line up with it by accident.
    "engine-poll" is what the engine does (``DeviceEvent`` polling).
    """
    import threading

    from aserve.device.events import CudaEventWaiter, DeviceEvent, LoopWaker

    def gpu_event() -> torch.cuda.Event:
        torch.cuda._sleep(sleep_cycles)
        ev = torch.cuda.Event()
        ev.record()
        return ev

    def done_time(ev: torch.cuda.Event) -> float:
        while not ev.query():
            pass
        return time.perf_counter()

    async def _poll(name: str, ev: torch.cuda.Event) -> None:
        if name == "engine-poll":
            await DeviceEvent("bench", ev, poll_s=50e-6).wait()
        elif name == "poll-yield":
            while not ev.query():
                await anyio.lowlevel.checkpoint()
        else:
            while not ev.query():
                await anyio.sleep(50e-6)

    async def strategy(name: str) -> dict[str, Any]:
        waiter = CudaEventWaiter(LoopWaker()) if name == "waiter-thread" else None
        lat: list[float] = []
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _i in range(waits):
            ev = gpu_event()
            if name == "waiter-thread":
                assert waiter is not None
                dev = DeviceEvent("bench", ev)
                waiter.watch(dev)
                await dev.wait()
            else:
                await _poll(name, ev)
            lat.append(time.perf_counter())
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        if waiter is not None:
            waiter.close()
        # Calibration pass: the same events with a spinning timestamp thread -> latency.
        lats = []
        for _i in range(10):
            ev = gpu_event()
            box: dict[str, float] = {}
            th = threading.Thread(target=lambda e=ev, b=box: b.__setitem__("t", done_time(e)))
            th.start()
            if name == "waiter-thread":
                waiter2 = CudaEventWaiter(LoopWaker())
                dev = DeviceEvent("bench", ev)
                waiter2.watch(dev)
                await dev.wait()
                waiter2.close()
            else:
                await _poll(name, ev)
            t_wake = time.perf_counter()
            th.join()
            lats.append(t_wake - box["t"])
        return {"strategy": name, "cpu_s_per_wall_s": cpu / wall, "median_wake_latency_us": statistics.median(lats) * 1e6,
                "max_wake_latency_us": max(lats) * 1e6}  # fmt: skip

    out = []
    for name in ("waiter-thread", "poll-yield", "poll-sleep-50us", "engine-poll"):
        out.append(anyio.run(strategy, name))
    return out

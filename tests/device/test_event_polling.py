"""How the engine awaits a CUDA event without a helper thread (``DeviceEvent`` polling), on a
stand-in event whose ``query()`` turns true after a given number of asks: the same code path
as on CUDA, run on any machine. ``poll_s=0`` (``cuda_event_wait="spin"``, the default) asks at
every pass of the loop and lets every other task run between asks."""

from __future__ import annotations

import anyio
import pytest

from aserve.device.events import DeviceEvent


class StandInEvent:
    def __init__(self, done_after: int) -> None:
        self.asks = 0
        self.done_after = done_after

    def query(self) -> bool:
        self.asks += 1
        return self.asks > self.done_after


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_spin_asks_at_every_pass_and_other_tasks_run_between(backend: str) -> None:
    stand_in = StandInEvent(done_after=40)
    event = DeviceEvent("step0.copied", stand_in, poll_s=0.0)  # type: ignore[arg-type]
    passes = 0
    finished = False

    async def other() -> None:
        nonlocal passes
        while not finished:
            passes += 1
            await anyio.lowlevel.checkpoint()

    async def main() -> None:
        nonlocal finished
        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            await event.wait()
            finished = True
        assert event.done() and event.host_time > 0

    anyio.run(main, backend=backend)
    assert stand_in.asks == 41  # asked at every pass until it said yes, and not once more
    assert passes >= 30  # the other task ran between the asks: the wait never held the loop


def test_the_timed_poll_still_ends() -> None:
    stand_in = StandInEvent(done_after=3)
    event = DeviceEvent("step0.copied", stand_in, poll_s=50e-6)  # type: ignore[arg-type]
    anyio.run(event.wait)
    assert stand_in.asks == 4 and event.done()

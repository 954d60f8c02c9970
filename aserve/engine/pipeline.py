"""Pipeline slots: the one number that separates overlap (depth 2) from serial (depth 1)."""

from __future__ import annotations

from typing import NamedTuple

import anyio


class Signal:
    """A reusable broadcast wake-up: ``set()`` wakes everyone waiting at that moment.

    Waiters re-check their condition after waking; a waiter that checked and then called
    ``wait()`` without an await in between cannot miss a ``set()`` (one thread, cooperative).
    """

    __slots__ = ("_event", "_waiters")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._waiters = 0

    def set(self) -> None:
        if not self._waiters:  # nobody to wake: skip making a new event (the hot path)
            return
        event, self._event = self._event, anyio.Event()
        event.set()

    async def wait(self) -> None:
        self._waiters += 1
        try:
            await self._event.wait()
        finally:
            self._waiters -= 1


class SlotStats(NamedTuple):
    depth: int
    in_use: int


class PipelineSlots:
    """At most ``depth`` steps are planned-or-in-flight and not yet committed.

    The planner takes a slot before planning and the committer returns it after committing,
    so with depth 2 the device runs step n while the host commits n-1 and plans n+1; with
    depth 1 each step is committed before the next is planned.
    """

    def __init__(self, depth: int) -> None:
        assert depth in (1, 2, 3), f"pipeline depth must be 1, 2 or 3, got {depth}"
        self.depth = depth
        self.in_use = 0
        self._changed = Signal()

    async def acquire(self) -> None:
        """Wait for a free slot. Cancellation while waiting takes nothing."""
        while self.in_use >= self.depth:
            await self._changed.wait()
        self.in_use += 1

    def release(self) -> None:
        assert self.in_use > 0, "released a pipeline slot nobody held"
        self.in_use -= 1
        self._changed.set()

    async def wait_until(self, in_use: int) -> None:
        """Wait until at most ``in_use`` slots are held (``0``: the pipeline is drained)."""
        while self.in_use > in_use:
            await self._changed.wait()

    def statistics(self) -> SlotStats:
        return SlotStats(self.depth, self.in_use)

"""A broadcast wake-up for coroutines of one event loop (anyio: asyncio or trio)."""

from __future__ import annotations

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

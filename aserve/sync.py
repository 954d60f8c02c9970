"""A broadcast wake-up for coroutines of one event loop (anyio: asyncio or trio)."""

from __future__ import annotations

import anyio


class Signal:
    """A reusable broadcast wake-up: ``set()`` wakes everyone waiting at that moment.

    Waiters re-check their condition after waking; a waiter that checked and then called
    ``wait()`` without an await in between cannot miss a ``set()`` (one thread, cooperative).
    """

    __slots__ = ("_armed", "_event")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._armed = False  # someone waits on the current event and it is not set yet

    def set(self) -> None:
        # The hot path: a committer pushes many tokens per step, and only the first push
        # after a wait() has anything to do; the rest cost one attribute read.
        if not self._armed:
            return
        self._armed = False
        event, self._event = self._event, anyio.Event()
        event.set()

    async def wait(self) -> None:
        self._armed = True
        await self._event.wait()

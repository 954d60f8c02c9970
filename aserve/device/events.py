"""Awaitable device events and in-order device streams, for CPU and CUDA.

A *stream* runs submitted work in order. An *event* recorded on a stream completes when
the stream reaches it; ``await event.wait()`` suspends only the awaiting coroutine. The
event loop is woken from the device side through a thread-safe callback, so no coroutine
ever blocks the loop on the device.

* CPU: one worker thread is the stream. ``submit(fn)`` queues ``fn``; an event is a marker
  in the same queue. The loop keeps planning and committing while the worker computes.
* CUDA: work is enqueued on ``torch.cuda.Stream``s by the caller; an event is a
  ``torch.cuda.Event``. One waiter thread blocks in ``cudaEventSynchronize`` (which releases
  the GIL) on each awaited event in turn and then wakes the loop. Events on one stream
  complete in order, so a single waiter thread loses nothing by waiting in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import torch


class LoopWaker:
    """Runs a callback on the event loop from any thread, without blocking that thread."""

    def __init__(self) -> None:
        self._call: Callable[[Callable[[], object]], object]
        try:
            loop = asyncio.get_running_loop()
            self._call = loop.call_soon_threadsafe
        except RuntimeError:
            import trio  # anyio's other backend

            token = trio.lowlevel.current_trio_token()
            self._call = token.run_sync_soon

    def call_soon(self, fn: Callable[[], object]) -> None:
        # RuntimeError: the loop is closed (engine torn down), nobody is left to wake.
        with contextlib.suppress(RuntimeError):
            self._call(fn)


class HostMark:
    """A state reached on the host (a step planned, launched, committed): resolved exactly
    once, awaitable by any coroutine. ``host_time`` is when it was reached.

    The waiters' event is made only when someone waits, so an unwatched mark costs a few
    attribute writes per step. ``cancel`` (engine shutdown) resolves it with an error that
    every waiter, present or later, receives."""

    __slots__ = ("_error", "_event", "done_flag", "host_time", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.done_flag = False
        self.host_time = 0.0
        self._event: anyio.Event | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self.done_flag

    def set(self, host_time: float) -> None:
        assert not self.done_flag, f"{self.name} resolved twice"
        self.done_flag = True
        self.host_time = host_time
        if self._event is not None:
            self._event.set()

    def cancel(self, error: BaseException) -> None:
        """Resolve with ``error`` unless already resolved (shutdown: it will never be reached)."""
        if self.done_flag:
            return
        self._error = error
        self.done_flag = True
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        """Suspend until the state is reached; raises the shutdown error if it never will be.
        Cancellation only stops the wait."""
        if not self.done_flag:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        if self._error is not None:
            raise self._error


class DeviceEvent:
    """A point in a device stream; ``await wait()`` returns once the device passed it.

    ``host_time`` is the host clock (``time.perf_counter``) when the point was passed on
    the CPU backend (on CUDA, when a waiter or a poll saw it); device timing on CUDA comes
    from ``cuda_event``. ``cancel`` (engine shutdown) resolves a point the device will never
    report with an error for its waiters.
    """

    __slots__ = ("_cancelled", "_done", "_error", "_flag", "cuda_event", "host_time", "name", "poll_s")

    def __init__(self, name: str, cuda_event: torch.cuda.Event | None = None, poll_s: float | None = None) -> None:
        self.name = name
        self._flag = anyio.Event()
        self._done = False
        self._error: BaseException | None = None
        self._cancelled = False
        self.cuda_event = cuda_event
        self.host_time = 0.0
        # Polling mode (CUDA): ``wait`` asks the event with ``query()`` and sleeps ``poll_s``
        # between asks (0: yields to the loop once), on the loop itself; no helper thread.
        self.poll_s = poll_s

    def done(self) -> bool:
        if not self._done and self.poll_s is not None and self.cuda_event is not None and self.cuda_event.query():
            self.host_time = time.perf_counter()
            self._done = True
        return self._done

    def _complete(self, error: BaseException | None = None) -> None:
        # Runs on the event loop thread.
        if self._done:
            return  # cancelled at shutdown before the device reported it
        self._error = error
        self._done = True
        self._flag.set()

    def cancel(self, error: BaseException) -> None:
        """Shutdown: waiters get ``error`` unless the device already passed this point."""
        if self.done():
            return
        self._error = error
        self._cancelled = True
        self._done = True
        self._flag.set()

    async def wait(self) -> None:
        """Suspend until the device passed this event. Cancellation only stops the wait."""
        if self.poll_s is None and not self._done:
            # Set on completion, or when an event created before its CUDA event was recorded
            # switches to polling (cuda_record's ``into``).
            await self._flag.wait()
        if self.poll_s is not None:
            while not self.done():  # noqa: ASYNC110 - polling is the measured choice on CUDA
                await anyio.sleep(self.poll_s)
        if self._error is not None:
            if self._cancelled:
                raise self._error
            raise DeviceError(f"device work before event {self.name!r} failed") from self._error


class DeviceError(RuntimeError):
    """Work on the device stream raised; the engine cannot continue with this step."""


class CpuStream:
    """A worker thread that runs submitted callables in order: the CPU's 'device stream'."""

    def __init__(self, waker: LoopWaker, name: str = "aserve-cpu-stream") -> None:
        self._waker = waker
        # (work, is_marker); None stops the thread.
        self._queue: queue.SimpleQueue[tuple[Callable[[], None], bool] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> None:
        self._queue.put((fn, False))

    def record(self, name: str, into: DeviceEvent | None = None) -> DeviceEvent:
        """A point after the work submitted so far; ``into``: resolve this event (created
        earlier, maybe awaited already) rather than a new one."""
        event = DeviceEvent(name) if into is None else into

        def mark() -> None:
            event.host_time = time.perf_counter()
            err = self._error
            self._waker.call_soon(lambda: event._complete(err))

        self._queue.put((mark, True))
        return event

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, is_marker = item
            if self._error is not None and not is_marker:
                continue  # after a failure only markers run, so every waiter learns of it
            try:
                fn()
            except BaseException as exc:
                self._error = exc

    def close(self, join_s: float = 30.0) -> None:
        """Stop the thread after the work already queued; wait at most ``join_s`` seconds for
        it (a stalled device may never let it finish; the thread is a daemon)."""
        self._queue.put(None)
        self._thread.join(timeout=join_s)


class CudaEventWaiter:
    """One helper thread that turns completed CUDA events into loop wake-ups."""

    def __init__(self, waker: LoopWaker) -> None:
        self._waker = waker
        self._queue: queue.SimpleQueue[DeviceEvent | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="aserve-cuda-waiter", daemon=True)
        self._thread.start()

    def watch(self, event: DeviceEvent) -> None:
        self._queue.put(event)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            err: BaseException | None = None
            try:
                assert event.cuda_event is not None
                event.cuda_event.synchronize()
            except BaseException as exc:
                err = exc
            event.host_time = time.perf_counter()
            self._waker.call_soon(lambda ev=event, e=err: ev._complete(e))  # type: ignore[misc]

    def close(self, join_s: float = 30.0) -> None:
        """Stop the thread after the work already queued; wait at most ``join_s`` seconds for
        it (a stalled device may never let it finish; the thread is a daemon)."""
        self._queue.put(None)
        self._thread.join(timeout=join_s)


# cuda_event_wait="poll": between two asks of an awaited CUDA event. On an otherwise idle
# asyncio loop the sleep lasts a millisecond (epoll's resolution); "spin" asks at every pass (0).
POLL_INTERVAL_S = 50e-6


def cuda_record(
    stream: Any,
    waiter: CudaEventWaiter | None,
    name: str,
    *,
    poll_s: float = POLL_INTERVAL_S,
    into: DeviceEvent | None = None,
) -> DeviceEvent:
    """Record a timing CUDA event on ``stream``; ``await event.wait()`` works either way.

    With a ``waiter`` the loop is woken by the waiter thread on completion; without one,
    ``wait()`` asks the event every ``poll_s`` seconds, or at every pass of the loop with
    ``poll_s=0`` (the engine's default: a sleep shorter than a millisecond lasts a millisecond
    on an idle asyncio loop; see docs/architecture.md). Polling costs nothing until somebody
    waits, so events only some coroutines watch take no waiter.

    ``into``: record into this event, created earlier without a CUDA event (a step whose
    sampler launches later); coroutines may be waiting on it already.
    """
    cuda_event = torch.cuda.Event(enable_timing=True)
    cuda_event.record(stream)
    if into is not None:
        assert into.cuda_event is None and into.poll_s is None, f"{into.name} was recorded already"
        into.cuda_event = cuda_event
        if waiter is not None:
            waiter.watch(into)
        else:
            into.poll_s = poll_s
            into._flag.set()  # its waiters move on to polling (see wait)
        return into
    if waiter is None:
        return DeviceEvent(name, cuda_event, poll_s=poll_s)
    event = DeviceEvent(name, cuda_event)
    waiter.watch(event)
    return event

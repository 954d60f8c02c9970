"""Drives one run: warm-up, the arrival schedule (or closed-loop users), and the watchers.

Every task lives in a visible task group: the request tasks in an inner group, the event-loop
lag ticker and the progress display in the outer one, which is cancelled once the requests end.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from rich.console import Console

from loadgen.arrivals import arrival_times, count_for_duration
from loadgen.progress import Progress
from loadgen.records import RequestRecord
from loadgen.workloads import WorkItem

Clock = Callable[[], float]


class Target(Protocol):
    @property
    def model(self) -> str: ...  # the model name requests carry

    async def wait_ready(self, limit_s: float) -> None: ...

    async def server_counters(self) -> dict[str, float] | None: ...

    async def send(self, item: WorkItem, rec: RequestRecord, now: Clock) -> None: ...


@dataclass(frozen=True)
class LoadSpec:
    rate: float = math.inf  # requests/s; inf sends everything at once
    process: str = "poisson"  # poisson, constant, gamma
    burstiness: float = 1.0  # gamma shape
    max_concurrency: int | None = None
    users: int | None = None  # closed loop: this many users, each waiting for its answer
    think_time: float = 0.0  # closed loop: pause between a user's requests
    duration: float | None = None  # stop sending after this many seconds
    warmup: int = 0  # requests sent (and awaited) before the measured run; excluded
    seed: int = 0
    run_timeout: float | None = None  # cancel whatever is still running after this long
    lag_interval: float = 0.01


@dataclass
class RunOutput:
    records: list[RequestRecord]
    warmup_records: list[RequestRecord]
    loop_lags: list[tuple[float, float]]  # (time, lag) of the ticker
    wall_s: float
    last_send_s: float  # when the last request was sent: the schedule's end
    counters_before: dict[str, float] | None
    counters_after: dict[str, float] | None
    cancelled_at_timeout: bool = False
    t0_perf: float = 0.0  # perf_counter() at the run's t=0, to line records up with other traces
    notes: list[str] = field(default_factory=list)
    cpu_s: float = 0.0  # this client process's CPU time over the run (all its threads)
    stopped_at: float | None = None  # the run was stopped early (a signal) at this t


class Runner:
    def __init__(self, target: Target, spec: LoadSpec, *, progress: bool = True, scrape: bool = True) -> None:
        self.target = target
        self.spec = spec
        self.show_progress = progress
        # False in one of --client-procs processes: the parent reads the server's counters
        # around the whole run, and a scrape here would sit between the start and the first send.
        self.scrape = scrape
        self._t0 = time.perf_counter()
        self.stopped_at: float | None = None  # stop() was called, at this t
        self._scope: anyio.CancelScope | None = None  # the measured run's, while it runs

    def stop(self) -> None:
        """End the run early (Ctrl-C): nothing more is sent, requests in flight are cancelled
        (listed as unfinished), and the run returns what it has. A run not yet started ends at once."""
        if self.stopped_at is None:
            self.stopped_at = self.now()
        if self._scope is not None:
            self._scope.cancel()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    async def run(self, items: Sequence[WorkItem]) -> RunOutput:
        spec = self.spec
        warm = await self._warmup(items[: spec.warmup])
        before = await self.target.server_counters() if self.scrape else None
        self._t0 = time.perf_counter()
        if self.stopped_at is not None:  # stopped before the measured run: it ends at its t=0
            self.stopped_at = 0.0
        cpu0 = time.process_time()
        records: list[RequestRecord] = []
        lags: list[tuple[float, float]] = []
        progress = Progress(records, self.now, enabled=self.show_progress)
        timed_out = False
        async with anyio.create_task_group() as watchers:
            watchers.start_soon(self._ticker, lags, name="loadgen.loop_lag")
            watchers.start_soon(progress.loop, name="loadgen.progress")
            with anyio.move_on_after(spec.run_timeout) as scope:
                self._stoppable(scope)
                async with anyio.create_task_group() as reqs:
                    if spec.users:
                        for u in range(spec.users):
                            reqs.start_soon(self._user, items, records, name=f"loadgen.user{u}")
                    else:
                        await self._open_loop(reqs, items, records)
            self._scope = None
            timed_out = scope.cancelled_caught and self.stopped_at is None
            watchers.cancel_scope.cancel()
        progress.close()
        wall = self.now()
        cpu = time.process_time() - cpu0
        after = await self.target.server_counters() if self.scrape else None
        last_send = max((r.send_s for r in records if r.send_s is not None), default=0.0)
        return RunOutput(records, warm, lags, wall, last_send, before, after, timed_out, t0_perf=self._t0, cpu_s=cpu,
                         stopped_at=self.stopped_at)  # fmt: skip

    async def _warmup(self, items: Sequence[WorkItem]) -> list[RequestRecord]:
        recs = [RequestRecord(i, it.prompt_len, it.max_tokens, None, warmup=True) for i, it in enumerate(items)]
        limit = anyio.CapacityLimiter(self.spec.max_concurrency or self.spec.users or max(1, len(items)))

        async def one(it: WorkItem, rec: RequestRecord) -> None:
            async with limit:
                await self.target.send(it, rec, self.now)

        with anyio.CancelScope() as scope:  # stop() ends a warm-up too
            self._stoppable(scope)
            async with anyio.create_task_group() as tg:
                for it, rec in zip(items, recs):
                    tg.start_soon(one, it, rec, name=f"loadgen.warmup{rec.index}")
        self._scope = None
        return recs

    def _stoppable(self, scope: anyio.CancelScope) -> None:
        """``stop()`` cancels ``scope`` from now on (at once if it was called already)."""
        self._scope = scope
        if self.stopped_at is not None:
            scope.cancel()

    async def _open_loop(self, tg: Any, items: Sequence[WorkItem], records: list[RequestRecord]) -> None:
        spec = self.spec
        if items and items[0].timestamp is not None:  # trace replay: the trace is the schedule
            times = [it.timestamp or 0.0 for it in items]
        else:
            n = len(items)
            if spec.duration is not None:
                n = min(n, count_for_duration(spec.duration, spec.rate)) if not math.isinf(spec.rate) else n
            times = arrival_times(n, spec.rate, spec.burstiness, spec.seed, process=spec.process)
        limit = anyio.CapacityLimiter(spec.max_concurrency) if spec.max_concurrency else None
        for i, (item, at) in enumerate(zip(items, times)):
            if (spec.duration is not None and at > spec.duration) or self.stopped_at is not None:
                break
            delay = at - self.now()
            if delay > 0:
                await anyio.sleep(delay)
            rec = RequestRecord(i, item.prompt_len, item.max_tokens, at)
            records.append(rec)
            tg.start_soon(self._one, item, rec, limit, name=f"loadgen.req{i}")

    async def _one(self, item: WorkItem, rec: RequestRecord, limit: anyio.CapacityLimiter | None) -> None:
        if limit is None:
            rec.ready_s = rec.scheduled_s
            await self.target.send(item, rec, self.now)
            return
        async with limit:
            rec.ready_s = self.now()
            await self.target.send(item, rec, self.now)

    async def _user(self, items: Sequence[WorkItem], records: list[RequestRecord]) -> None:
        spec = self.spec
        while self.stopped_at is None:
            i = len(records)
            if spec.duration is not None:
                if self.now() >= spec.duration:
                    return
                item = items[i % len(items)]  # a timed closed loop cycles through the workload
            elif i >= len(items):
                return
            else:
                item = items[i]
            rec = RequestRecord(i, item.prompt_len, item.max_tokens, None)
            records.append(rec)
            rec.ready_s = self.now()
            await self.target.send(item, rec, self.now)
            if spec.think_time:
                await anyio.sleep(spec.think_time)

    async def _ticker(self, lags: list[tuple[float, float]]) -> None:
        """How late the loop wakes a sleeper: a busy client delays every timestamp it takes."""
        step = self.spec.lag_interval
        while True:
            due = self.now() + step
            await anyio.sleep(step)
            t = self.now()
            lags.append((t, max(0.0, t - due)))


class Stopper:
    """Ends the run under way, and every later one before it starts, once :meth:`stop` is
    called (the first Ctrl-C of ``loadgen run``): a sweep's remaining points are not run."""

    def __init__(self) -> None:
        self.runner: Runner | None = None
        self.stopped = False

    def attach(self, runner: Runner) -> None:
        self.runner = runner
        if self.stopped:
            runner.stop()

    def stop(self) -> float | None:
        """Stop; the run's t at the stop (None between runs)."""
        self.stopped = True
        if self.runner is None:
            return None
        self.runner.stop()
        return self.runner.stopped_at


async def stop_on_signal(stop: Callable[[str], str], scope: anyio.CancelScope) -> None:
    """The first SIGINT or SIGTERM calls ``stop`` with the signal's name and prints what it
    returns; a second one cancels ``scope`` (the command gives up, writing nothing more)."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        stopped = False
        async for sig in signals:
            if stopped:
                scope.cancel()
                return
            stopped = True
            Console(stderr=True).print(stop(signal.Signals(sig).name), highlight=False)


async def stoppable(body: Callable[[Stopper], Awaitable[None]], what: str) -> Stopper:
    """Run ``body`` with a :class:`Stopper` the first SIGINT or SIGTERM stops (the run under
    way writes what it has; ``body`` should start no other); a second one abandons the command
    (SystemExit). Returns the stopper: ``stopped`` says whether a signal came."""
    stopper = Stopper()

    def stop(name: str) -> str:
        at = stopper.stop()
        when = "" if at is None else f" at t={at:.1f}s"
        return f"{name}: {what} stopped{when}; writing what it has (again to abandon)"

    done = False
    try:
        async with anyio.create_task_group() as tg:
            if threading.current_thread() is threading.main_thread():  # signal handlers live there
                tg.start_soon(stop_on_signal, stop, tg.cancel_scope, name="loadgen.signals")
            await body(stopper)
            tg.cancel_scope.cancel()
            done = True
    except BaseExceptionGroup as group:  # the task group wraps what the body raised: one error
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    if not done:
        raise SystemExit(f"{what} abandoned by a second signal")
    return stopper

"""The step loop: three coroutines in one task group, meeting at awaitable device events.

    ingest ──► waiting queue ──► plan + launch ──► in-flight channel ──► commit ──► output cells
                                      ▲                                    │
                                      └──────── pipeline slots ◄───────────┘

The overlap reads as the seed's pseudo-code, split over two coroutines::

    plan loop:   plan = await next_plan()        # takes a slot: at most `depth` steps uncommitted
                 step = runner.launch(plan)      # returns before the device finishes
                 send(step)
    commit loop: await step.copied               # the device ran step n meanwhile ...
                 commit(step)                    # ... while the host committed n-1 and planned n+1

Planning a step and committing a step are each one synchronous stretch with no ``await``
inside; awaits sit only at the edges (taking a slot, awaiting a device event, sending on a
channel). That is the lock that keeps the planner and the committer from seeing a ``Req``
half-updated by the other.

Faults: an exception from planning, launching or committing a step, a step whose device work
raised, or a step that does not complete within the watchdog's limit breaks the engine for
good (as in SGLang and vLLM: after a device fault the CUDA context cannot be trusted, and the
host state may be half-updated). Every request in flight then ends with
:class:`EngineFailedError`, the coroutines return, new requests are refused, and ``failed``
is set for whoever hosts the engine. A KV allocation that fails for one request while
planning ends only that request (``Scheduler.failed``, :class:`KVAllocationError`).
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aserve.device.events import DeviceError
from aserve.device.inputs import StepInputs
from aserve.device.runner import ModelRunner
from aserve.device.step import Step
from aserve.engine.commit import Committer
from aserve.engine.pipeline import PipelineSlots
from aserve.engine.recorder import StepRecorder
from aserve.engine.watchdog import LoopWatchdog
from aserve.errors import EngineClosedError, EngineFailedError, KVAllocationError, KVCapacityError
from aserve.logs import get_logger
from aserve.sampling.masks import FillBeside, FillRunner
from aserve.scheduler.plan import Blocked, Plan
from aserve.scheduler.policy import Scheduler
from aserve.scheduler.req import Req
from aserve.sync import Signal

log = get_logger("aserve.engine")


class StepLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        committer: Committer,
        recorder: StepRecorder,
        *,
        pipeline_depth: int,
        debug: bool = False,
        watchdog_s: float | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.committer = committer
        self.recorder = recorder
        self.slots = PipelineSlots(pipeline_depth)
        self.debug = debug
        self.work = Signal()  # something changed that the planner may act on
        self.watchdog_s = watchdog_s  # how long the committer waits for a step's results; None: forever
        self.broken: EngineFailedError | None = None  # set after a fault: nothing runs again
        self.failed = anyio.Event()  # set with ``broken``
        self.stalled = False  # the watchdog fired: the device may never finish what it holds
        # Monotonic launch times of the steps in flight, oldest first, and the start of a launch
        # under way (on CUDA a stalled device can block the loop inside one): the backstop reads both.
        self._launched_at: collections.deque[float] = collections.deque()
        self._launching_since: float | None = None
        self._plan_scope = anyio.CancelScope()  # the plan loop's: a fault ends it wherever it waits
        self._ingest: MemoryObjectSendStream[list[Req]] | None = None
        self.live: set[Req] = set()  # submitted and not finished (the engine's on_finish discards)
        self._uncommitted: set[Step] = set()  # launched, not yet committed (cancelled at shutdown)
        self._watchers: list[MemoryObjectSendStream[Step]] = []
        self._idle_before_next = True
        # Split launch (structured outputs): the step whose sampler waits for the commits of the
        # steps before it, and a wake-up for the planner, which launches nothing meanwhile (the
        # next forward reads that sampler's tokens). ``split_masks``: whether steps may split.
        self.split_masks = scheduler.config.constrained_lookahead
        # Launch a split step's sampler between the two parts of the commit before it (the
        # grammar advance, then the rest), not after the whole commit. ``ASERVE_EARLY_SAMPLER=0``
        # waits for the whole commit, kept to measure one against the other.
        self.early_sampler = os.environ.get("ASERVE_EARLY_SAMPLER", "1") != "0"
        self.early_samplers = 0  # split steps' samplers launched between a commit's two parts
        self.launched_behind = 0  # ... with the next step launched before that commit's second part
        # The split step's mask fill (its GIL-free part) beside the rest of the commit before it,
        # on a helper thread; ``ASERVE_FILL_BESIDE=0`` fills first and commits after, kept to
        # measure one against the other.
        self.fill_beside = FillBeside() if os.environ.get("ASERVE_FILL_BESIDE", "1") != "0" else None
        self._deferred: Step | None = None
        self._sampled = Signal()
        self.planned_ahead = 0  # steps planned while a split step's sampler waited (depth 3)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the three coroutines while the block runs; leaving it cancels them, and every
        step state not yet reached resolves with :class:`EngineClosedError` for its waiters."""
        steps_send, steps_recv = anyio.create_memory_object_stream[Step](self.slots.depth)
        ingest_send, ingest_recv = anyio.create_memory_object_stream[list[Req]](math.inf)
        self._ingest = ingest_send
        # The backstop for a loop that a stalled device blocks outright (aserve/engine/watchdog.py).
        backstop = None
        if self.watchdog_s is not None:
            backstop = LoopWatchdog(self.watchdog_s, self._oldest_launch, lambda: self.broken is not None)
            backstop.start()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._ingest_loop, ingest_recv, name="aserve.ingest")
                tg.start_soon(self._plan_loop, steps_send, name="aserve.plan_launch")
                tg.start_soon(self._commit_loop, steps_recv, name="aserve.commit")
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            if backstop is not None:
                backstop.stop()
            if self.fill_beside is not None:
                self.fill_beside.close()
            self._ingest = None
            closed = EngineClosedError("the engine shut down before this step state was reached")
            for step in self._uncommitted:
                step.cancel_unreached(closed)
            self._uncommitted.clear()  # their keepalive holds device tensors
            self._launched_at.clear()
            for watcher in self._watchers:
                watcher.close()

    def submit(self, reqs: list[Req]) -> None:
        assert self._ingest is not None, "the step loop is not running"
        self.live.update(reqs)
        self._ingest.send_nowait(reqs)

    def abort(self, req: Req) -> None:
        """End ``req`` now ("abort"); its KV returns once no step in flight reads it."""
        if req.finished:
            return
        req.abort_requested = True
        self.committer.finish(req, "abort")
        if not self.scheduler.remove_waiting(req):
            self.scheduler.release_if_done(req)
        self.work.set()

    @asynccontextmanager
    async def watch_steps(self) -> AsyncIterator[MemoryObjectReceiveStream[Step]]:
        """Every step launched while the block runs, in launch order; the stream ends when
        the engine shuts down. A watcher that falls behind costs memory, never the loop's time."""
        send, recv = anyio.create_memory_object_stream[Step](math.inf)
        self._watchers.append(send)
        try:
            async with recv:
                yield recv
        finally:
            with contextlib.suppress(ValueError):
                self._watchers.remove(send)
            send.close()

    # -- the coroutines -------------------------------------------------------------

    async def _ingest_loop(self, recv: MemoryObjectReceiveStream[list[Req]]) -> None:
        async with recv:
            async for reqs in recv:
                # Everything already queued goes in before the planner runs again: requests
                # that arrive together are admitted together, not one per step.
                batch = [reqs]
                with contextlib.suppress(anyio.WouldBlock):
                    while True:
                        batch.append(recv.receive_nowait())
                for group in batch:
                    for r in group:
                        if not r.finished:  # aborted before it reached the queue
                            self.scheduler.add(r)
                self.work.set()

    async def _plan_loop(self, send: MemoryObjectSendStream[Step]) -> None:
        with self._plan_scope, send:
            while self.broken is None:
                try:
                    planned = await self._next_plan()  # planned: holds a pipeline slot
                    if planned is None:
                        return  # the engine broke while this loop waited
                    plan, host, plan_t0, planned_t = planned
                    self._launching_since = time.monotonic()
                    try:
                        # in flight: the device runs it (a split launch: its forward, for now)
                        step = self.runner.launch(
                            plan, host, planned_t - plan_t0, self.split_masks and bool(self._uncommitted)
                        )
                    finally:
                        self._launching_since = None
                except Exception as exc:
                    # On CUDA the forward is enqueued here, on the loop's thread: its errors land here.
                    self._fail_everything(f"planning or launching a step raised {exc!r}", exc)
                    return
                step.planned.set(planned_t)
                step.in_flight.set(step.launch_time)
                self._uncommitted.add(step)
                if step.finish_launch is not None:
                    self._deferred = step
                self._launched_at.append(time.monotonic())
                if self.recorder.trace is not None:
                    for seq in plan.extra:  # a block holds decodes only
                        if seq.prefix_len == 0:
                            self.recorder.trace.request_state(seq.req.rid, "running", step.launch_time)
                if self.debug:
                    self._track_pages(step, plan, +1)
                step.depth_in_use = self.slots.in_use
                step.after_idle = self._idle_before_next
                self._idle_before_next = False
                for watcher in self._watchers:
                    watcher.send_nowait(step)
                try:
                    await send.send(step)  # to the committer, which commits n-1 meanwhile
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the committer stopped after a device error; the engine is broken

    async def _next_plan(self) -> tuple[Plan, StepInputs, float, float] | None:
        """Take a pipeline slot and plan the next step: ``(plan, its host inputs, when planning
        began, when it ended)``, or None once the engine is broken.

        Waits, holding no slot, while there is nothing to run; drains the pipeline first when
        KV is short while steps are in flight (retraction needs a settled state).

        While a split step waits for its sampler (``_deferred``), the next step is planned at
        once and launched once that sampler is: the plan is made while the host would
        otherwise wait for the device, not between the sampler's launch and the next forward's.
        Its host inputs are built with it (they read committed state: a commit in between would
        change what the plan decided), and its requests count as in flight from here
        (``Req.inflight``), so a commit or an abort meanwhile does not free KV it will read."""
        await self.slots.acquire()
        while self.broken is None:
            t0 = time.perf_counter()
            self._end_stuck()
            result = self.scheduler.schedule(pipeline_busy=self.slots.in_use > 1)
            ended = self._end_stuck()  # requests whose KV allocation failed in this pass end now
            if isinstance(result, Plan):
                planned_t = time.perf_counter()
                host = self.runner.prepare(result)
                for req in result.reqs():
                    req.inflight += 1
                self.planned_ahead += self._deferred is not None
                while self._deferred is not None and self.broken is None:
                    await self._sampled.wait()  # its sampler launches after the next commit
                return (result, host, t0, planned_t) if self.broken is None else None
            self.slots.release()
            if result is Blocked.DRAIN:
                await self.slots.wait_until(0)
            elif not (self.scheduler.stuck or ended):  # stuck ones end at the top of the next pass
                if self.slots.in_use == 0:
                    self._idle_before_next = True
                await self.work.wait()
            await self.slots.acquire()
        return None

    async def _commit_loop(self, recv: MemoryObjectReceiveStream[Step]) -> None:
        async with recv:
            async for step in recv:
                # The watchdog: a step's results not back within the limit means a stalled device.
                with anyio.move_on_after(self.watchdog_s) as watchdog:
                    try:
                        await step.copied.wait()  # materialized, and the results are on the host
                    except DeviceError as exc:
                        self._fail_everything(f"step {step.index} failed on the device: {exc.__cause__!r}", exc)
                        return
                if watchdog.cancelled_caught:
                    self.stalled = True
                    self._fail_everything(
                        f"step {step.index} did not complete on the device within {self.watchdog_s:g} s "
                        "(watchdog_timeout): the device is stalled"
                    )
                    return
                t0 = time.perf_counter()
                deferred = self._deferred
                resumed: tuple[float, float] | None = None  # an early sampler's yield, for the trace
                try:
                    if self.debug:
                        self._track_pages(step, None, -1)
                    if self.early_sampler and deferred is not None and self._uncommitted == {step, deferred}:
                        early = await self._commit_around_sampler(step, deferred, t0)
                        if early is None:
                            return
                        commit_s, resumed = early
                    else:
                        self.committer.commit(step)
                        commit_s = time.perf_counter() - t0
                except Exception as exc:
                    self._fail_everything(f"committing step {step.index} raised {exc!r}", exc)
                    return
                step.committed.set(time.perf_counter())
                self._uncommitted.discard(step)
                self._launched_at.popleft()
                # Every step before a split one is committed: its masks can be filled now.
                deferred = self._deferred
                if deferred is not None and self._uncommitted == {deferred} and not self._finish_launch(deferred):
                    return
                self.recorder.record(step, commit_s, t0, resumed)
                self.slots.release()
                self.work.set()

    async def _commit_around_sampler(
        self, step: Step, deferred: Step, t0: float
    ) -> tuple[float, tuple[float, float]] | None:
        """Commit ``step``, the last step before the split step ``deferred``, around that
        step's sampler: once the grammar rows have advanced (all of ``deferred``'s masks read),
        its sampler goes, and the step planned meanwhile (depth 3) is launched behind it. The
        rest of this commit runs while the masks fill on the helper thread (``fill_beside``),
        or else after that launch, which the device then no longer waits for.

        Returns the commit's seconds and ``(end of the advance, start of the rest)`` for the
        trace, or None if the sampler's launch broke the engine. A fault of the commit raises."""
        advanced = self.committer.advance(step)
        first_end = time.perf_counter()
        rest: list[float] = []  # when the rest of the commit began, and its seconds
        rest_error: list[Exception] = []

        def finish_commit() -> None:
            t1 = time.perf_counter()
            try:
                self.committer.finish_commit(step, advanced)
            except Exception as exc:  # the commit's fault, not the sampler's
                rest_error.append(exc)
            rest.extend((t1, time.perf_counter() - t1))

        helper = self.fill_beside
        beside: FillRunner | None = None if helper is None else lambda work: helper.run(work, finish_commit)
        if not self._finish_launch(deferred, beside):
            return None
        if rest_error:
            raise rest_error[0]
        if rest:  # it ran within the sampler's launch: counted as the commit's time only
            deferred.launch_s -= rest[1]
        self.early_samplers += 1
        launched = len(self._launched_at)
        await anyio.lowlevel.checkpoint()
        self.launched_behind += len(self._launched_at) > launched
        if not rest:  # no fill beside (none, or no rows for the pool): the rest follows
            finish_commit()
        if rest_error:
            raise rest_error[0]
        return first_end - t0 + rest[1], (first_end, rest[0])

    def _finish_launch(self, step: Step, beside: FillRunner | None = None) -> bool:
        """Launch a split step's sampler (its masks read the matchers just advanced; ``beside``
        runs their fill's GIL-free part); False if that broke the engine."""
        assert step.finish_launch is not None
        t0 = time.perf_counter()
        self._launching_since = time.monotonic()
        try:
            step.finish_launch(beside)
        except Exception as exc:
            self._fail_everything(f"launching step {step.index}'s sampler raised {exc!r}", exc)
            return False
        finally:
            self._launching_since = None
        step.finish_launch = None
        step.launch_s += time.perf_counter() - t0
        self._deferred = None
        self._sampled.set()
        return True

    # -- what the coroutines share ---------------------------------------------------

    def _oldest_launch(self) -> float | None:
        """When the oldest step in flight was launched, or the launch under way began (read from
        the backstop's thread)."""
        oldest = self._launching_since
        with contextlib.suppress(IndexError):  # the loop may pop the last one meanwhile
            launched = self._launched_at[0]
            oldest = launched if oldest is None else min(oldest, launched)
        return oldest

    def _end_stuck(self) -> bool:
        """Requests that cannot fit the KV pool even alone, or whose KV allocation failed while
        planning, end with a typed error; the others run on. Returns whether any ended."""
        pool = self.scheduler.pool
        ended = bool(self.scheduler.stuck or self.scheduler.failed)
        while self.scheduler.failed:
            req, cause = self.scheduler.failed.pop()
            log.error("kv_allocation_failed", rid=req.rid, error=repr(cause))
            if not req.finished:
                why = "the pool found no room for it with nothing else running" if cause is None else repr(cause)
                self.committer.fail(
                    req,
                    KVAllocationError(
                        f"request {req.rid} ended: KV memory could not be allocated for it ({why}); "
                        "the engine runs on, and retrying the request may succeed"
                    ),
                )
            self.scheduler.release_if_done(req)
        while self.scheduler.stuck:
            req = self.scheduler.stuck.pop()
            log.warning("kv_exhausted", rid=req.rid, tokens=req.num_computed, kv_tokens=pool.total_tokens)
            if not req.finished:
                self.committer.fail(
                    req,
                    KVCapacityError(
                        f"request {req.rid} needs KV for {req.num_computed + 1} tokens but the pool holds "
                        f"{pool.total_tokens} and cannot hold it even alone; lower max_tokens or give the "
                        "engine more KV memory (--kv-cache-bytes, --mem-fraction)",
                        param="max_tokens",
                    ),
                )
            self.scheduler.release_if_done(req)
        return ended

    def _fail_everything(self, reason: str, cause: BaseException | None = None) -> None:
        """The engine is broken: every unfinished request ends with the same typed error, and
        nothing is planned again. KV stays held until the engine closes (the device may still
        be using it); the engine's ``aclose`` returns it all."""
        if self.broken is not None:
            return  # the first fault is the one to report
        log.error("engine_failed", reason=reason, stalled=self.stalled)
        error = EngineFailedError(f"the engine failed and stopped: {reason}")
        error.__cause__ = cause
        self.broken = error
        for req in list(self.live):
            if not req.finished:
                self.committer.fail(req, error)
        self.failed.set()
        self._plan_scope.cancel()  # at its next await: planning and launching are synchronous

    def _track_pages(self, step: Step, plan: Plan | None, sign: int) -> None:
        """Debug: count the KV pages each step in flight reads and writes."""
        prefix = self.scheduler.prefix
        if plan is not None:
            ps = self.scheduler.pool.page_size
            read = [p for s in plan.seqs for p in s.req.pages]
            written = [slot // ps for s in plan.seqs for slot in s.slots]
            step.debug_pages = (read, written)
        read, written = step.debug_pages
        if sign > 0:
            prefix.inflight_read.update(read)
            prefix.inflight_written.update(written)
        else:
            prefix.inflight_read.subtract(read)
            prefix.inflight_written.subtract(written)

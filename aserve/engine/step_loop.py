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
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aserve.device.events import DeviceError
from aserve.device.runner import ModelRunner
from aserve.device.step import Step
from aserve.engine.commit import Committer
from aserve.engine.pipeline import PipelineSlots
from aserve.engine.recorder import StepRecorder
from aserve.errors import EngineClosedError, KVCapacityError
from aserve.logs import get_logger
from aserve.scheduler.policy import Blocked, Plan, Scheduler
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
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.committer = committer
        self.recorder = recorder
        self.slots = PipelineSlots(pipeline_depth)
        self.debug = debug
        self.work = Signal()  # something changed that the planner may act on
        self.broken: BaseException | None = None  # set after a device error: nothing runs again
        self._ingest: MemoryObjectSendStream[list[Req]] | None = None
        self.live: set[Req] = set()  # submitted and not finished (the engine's on_finish discards)
        self._uncommitted: set[Step] = set()  # launched, not yet committed (cancelled at shutdown)
        self._watchers: list[MemoryObjectSendStream[Step]] = []
        self._idle_before_next = True

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the three coroutines while the block runs; leaving it cancels them, and every
        step state not yet reached resolves with :class:`EngineClosedError` for its waiters."""
        steps_send, steps_recv = anyio.create_memory_object_stream[Step](self.slots.depth)
        ingest_send, ingest_recv = anyio.create_memory_object_stream[list[Req]](math.inf)
        self._ingest = ingest_send
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
            self._ingest = None
            closed = EngineClosedError("the engine shut down before this step state was reached")
            for step in self._uncommitted:
                step.cancel_unreached(closed)
            self._uncommitted.clear()  # their keepalive holds device tensors
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
        async with send:
            while self.broken is None:
                plan, plan_t0 = await self._next_plan()  # planned: holds a pipeline slot
                planned_t = time.perf_counter()
                step = self.runner.launch(plan, planned_t - plan_t0)  # in flight: the device runs it
                step.planned.set(planned_t)
                step.in_flight.set(step.launch_time)
                self._uncommitted.add(step)
                for seq in plan.seqs:
                    seq.req.inflight += 1
                    if self.recorder.trace is not None and seq.prefix_len == 0:
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

    async def _next_plan(self) -> tuple[Plan, float]:
        """Take a pipeline slot and plan the next step: ``(plan, when planning began)``.

        Waits, holding no slot, while there is nothing to run; drains the pipeline first when
        KV is short while steps are in flight (retraction needs a settled state)."""
        await self.slots.acquire()
        while True:
            t0 = time.perf_counter()
            self._end_stuck()
            result = self.scheduler.schedule(pipeline_busy=self.slots.in_use > 1)
            if isinstance(result, Plan):
                return result, t0
            self.slots.release()
            if result is Blocked.DRAIN:
                await self.slots.wait_until(0)
            elif not self.scheduler.stuck:  # stuck ones end at the top of the next pass
                if self.slots.in_use == 0:
                    self._idle_before_next = True
                await self.work.wait()
            await self.slots.acquire()

    async def _commit_loop(self, recv: MemoryObjectReceiveStream[Step]) -> None:
        async with recv:
            async for step in recv:
                try:
                    await step.copied.wait()  # materialized, and the results are on the host
                except DeviceError as exc:
                    self._fail_everything(exc)
                    return
                t0 = time.perf_counter()
                if self.debug:
                    self._track_pages(step, None, -1)
                self.committer.commit(step)
                commit_s = time.perf_counter() - t0
                step.committed.set(t0 + commit_s)
                self._uncommitted.discard(step)
                self.recorder.record(step, commit_s, t0)
                self.slots.release()
                self.work.set()

    # -- what the coroutines share ---------------------------------------------------

    def _end_stuck(self) -> None:
        """Requests that cannot fit the KV pool even alone end with a typed error."""
        pool = self.scheduler.pool
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

    def _fail_everything(self, exc: BaseException) -> None:
        log.error("device_error", error=repr(exc.__cause__ or exc))
        self.broken = exc
        for req in list(self.live):
            if req.cell is not None:
                req.cell.fail(exc)

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

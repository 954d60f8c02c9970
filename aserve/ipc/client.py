"""The front end's side of the wire: ``EngineClient``, an engine core in another process.

The server calls it as it calls an :class:`aserve.Engine` (``open_stream``, ``complete``,
``stats``, ``tokenizer``, ``max_context``). Requests are validated and tokenized here with the
same :class:`~aserve.engine.admission.Admission` the engine uses (the core's limits arrive
in its ``Welcome``), then sent as ``Add``; the core's ``Outputs`` messages fill the same
output cells a local engine fills, so streams, detokenization, stop-string text limits and
``complete`` are the engine's own code (``aserve/engine/stream.py``).

If the core's engine fails (the core says so in a ``Status``, or a request ends with
:class:`EngineFailedError`), ``failure`` is set with that error and ``failed`` fires: every
request fails with it and the server answers 503 ``engine_failed`` until the core goes. If the
core stops answering (no ``Status`` for ``CORE_TIMEOUT_S``), every request fails with
:class:`EngineClosedError` and ``dead`` is set: the server answers 503 and exits.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import zmq
import zmq.asyncio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aserve import errors
from aserve.engine.admission import Admission, AdmissionLimits, Prompt, check_prompt_list
from aserve.engine.setup import load_tokenizer
from aserve.engine.stream import RequestStream, collect_result
from aserve.errors import AserveError, EngineClosedError, EngineFailedError
from aserve.ipc import messages as m
from aserve.ipc.delivery import deliver, deliver_columns, error_from, finish
from aserve.logs import get_logger
from aserve.outputs import CompletionResult
from aserve.sampling_params import SamplingParams
from aserve.scheduler.req import Req
from aserve.stats import EngineStats
from aserve.sync import Signal
from aserve.tokenizer.tokenizer import Tokenizer

log = get_logger("aserve.front_end")

HEARTBEAT_S = 1.0
# The core's death is known at once (the socket's disconnect event); a core this long silent
# is taken for hung. A core whose loop is held up by seconds of synchronous work is not.
CORE_TIMEOUT_S = 15.0


class EngineClient:
    def __init__(
        self, address: str, *, stream_interval: int = 1, seed: int | None = None, name: str | None = None
    ) -> None:
        self.address = address
        self.stream_interval = stream_interval
        self.seed = seed
        self.identity = (name or f"fe-{os.getpid()}").encode()  # the core's name for this front end
        self.dead = anyio.Event()  # the core stopped answering
        self.service_ready = anyio.Event()  # the core says every front end is ready
        self.broken: BaseException | None = None
        self.failure: EngineFailedError | None = None  # the core's engine stopped after a fault
        self.failed = anyio.Event()  # set with ``failure``
        self.live: dict[str, list[Req]] = {}
        self._admitted: dict[str, anyio.Event] = {}
        self._rejected: dict[str, AserveError] = {}
        self._replies: dict[int, Any] = {}
        self._reply_events: dict[int, anyio.Event] = {}
        self._qids = itertools.count()
        self._status: m.Status | None = None
        self._last_status = 0.0
        self._welcome: m.Welcome | None = None
        self._welcomed = anyio.Event()
        self._admission: Admission | None = None  # set once the Welcome came and the tokenizer loaded
        self._exit = AsyncExitStack()
        self._closed = False
        self._outbox: MemoryObjectSendStream[m.ToCore] | None = None

    # -- lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> EngineClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self, welcome_timeout_s: float = 3600.0) -> None:
        """Connect and wait for the core's ``Welcome`` (the core may still be loading the model)."""
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.identity)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)  # the core's outputs are never dropped here either
        sock.connect(self.address)
        self._ctx, self._sock = ctx, sock
        await self._exit.enter_async_context(self._running())
        with anyio.fail_after(welcome_timeout_s):
            await self._welcomed.wait()
        w = self._welcome
        assert w is not None
        self._tokenizer = await anyio.to_thread.run_sync(load_tokenizer, Path(w.model_path))
        limits = AdmissionLimits(
            vocab_size=w.vocab_size,
            max_context=w.max_context,
            kv_tokens=w.kv_tokens,
            eos_token_ids=tuple(w.eos_token_ids),
            max_waiting_requests=w.max_waiting_requests,
            stream_interval=self.stream_interval,
        )
        self._admission = Admission(limits, self._tokenizer, self.seed)
        self._post(m.Hello(ready=True))
        log.info("front_end_connected", core=self.address, model=w.model)

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        send, recv = anyio.create_memory_object_stream[m.ToCore](math.inf)
        self._outbox = send
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._send_loop, recv, name="aserve.front_end.send")
                tg.start_soon(self._receive_loop, name="aserve.front_end.receive")
                tg.start_soon(self._heartbeat_loop, name="aserve.front_end.heartbeat")
                tg.start_soon(self._monitor_loop, name="aserve.front_end.monitor")
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            self._outbox = None
            self._sock.close(linger=0)
            self._ctx.term()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for reqs in list(self.live.values()):
            for req in reqs:
                if not req.finished:
                    finish(req, "abort")
        with contextlib.suppress(Exception), anyio.move_on_after(1):
            await self._sock.send(m.encode(m.Bye()))
        await self._exit.aclose()

    # -- what the server calls ----------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        assert self._welcome is not None
        return self._welcome.max_context

    @property
    def ready(self) -> bool:
        return self._welcome is not None and self.broken is None and not self._closed

    def info(self) -> dict[str, Any]:
        assert self._welcome is not None
        return dict(self._welcome.info)

    def stats(self) -> EngineStats | None:
        """The core's stats as of its last heartbeat (at most ``STATUS_INTERVAL_S`` old)."""
        if self._status is None:
            return None
        return EngineStats(**self._status.stats)

    def open_stream(
        self, prompt: Prompt, params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> RequestStream:
        """Validate here, submit to the core; ``await stream.admitted()`` raises what the core refused."""
        reqs = self._submit(prompt, params or SamplingParams(), request_id, whole=False)
        rid = reqs[0].group_id
        return RequestStream(reqs, self._tokenizer, self.abort, admitted=lambda: self._wait_admitted(rid))

    async def complete(
        self, prompt: Prompt, params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> CompletionResult:
        reqs = self._submit(prompt, params or SamplingParams(), request_id, whole=True)
        await self._wait_admitted(reqs[0].group_id)
        return await collect_result(reqs, self._tokenizer, self.abort)

    def open_streams(
        self, prompts: Sequence[Prompt], params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> RequestStream:
        """``Engine.open_streams``: several prompts as one stream, one request each in the core."""
        reqs = self._submit_many(prompts, params or SamplingParams(), request_id, whole=False)
        rids = list(dict.fromkeys(r.group_id for r in reqs))
        return RequestStream(reqs, self._tokenizer, self.abort, admitted=lambda: self._wait_all_admitted(rids))

    async def complete_many(
        self, prompts: Sequence[Prompt], params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> CompletionResult:
        reqs = self._submit_many(prompts, params or SamplingParams(), request_id, whole=True)
        try:
            await self._wait_all_admitted(list(dict.fromkeys(r.group_id for r in reqs)))
        except BaseException:
            for r in reqs:
                self.abort(r)
            raise
        return await collect_result(reqs, self._tokenizer, self.abort)

    async def _wait_all_admitted(self, rids: list[str]) -> None:
        """Every prompt's admission. If the core refused one (a full queue, say), the others
        are aborted and the first refusal raised, as one process refuses the whole list before
        queueing any; the caller gone, they are aborted too."""
        refused: AserveError | None = None
        try:
            for rid in rids:
                try:
                    await self._wait_admitted(rid)
                except AserveError as exc:
                    refused = refused or exc
        except BaseException:
            self._abort_rids(rids)
            raise
        if refused is not None:
            self._abort_rids(rids)
            raise refused

    def _abort_rids(self, rids: list[str]) -> None:
        for rid in rids:
            reqs = self.live.get(rid)
            if reqs:
                self.abort(reqs[0])
            self._admitted.pop(rid, None)
            self._rejected.pop(rid, None)

    def _submit_many(
        self, prompts: Sequence[Prompt], params: SamplingParams, request_id: str | None, *, whole: bool
    ) -> list[Req]:
        check_prompt_list(prompts)
        if len(prompts) == 1:
            return self._submit(prompts[0], params, request_id, whole=whole)
        if not prompts:
            raise errors.InvalidRequestError("no prompts given", param="prompt")
        if self._admission is None:
            raise EngineClosedError("the front end is not connected to the engine core; no requests are accepted")
        signal = Signal()  # one consumer for all of them
        wake = 0 if whole else self._admission.limits.stream_interval
        # Every prompt is validated before any is sent.
        groups = [
            self._make(p, params, None if request_id is None else f"{request_id}-{k}", whole, signal, wake)
            for k, p in enumerate(prompts)
        ]
        for reqs in groups:
            self._send_add(reqs, params)
        return [r for reqs in groups for r in reqs]

    async def flush_cache(self) -> int:
        return int(await self._query("flush_cache"))

    async def refresh_stats(self) -> None:
        """Ask the core for its stats now (a scrape must not see a heartbeat-old ledger)."""
        stats = await self._query("stats")
        self._status = m.Status(ready=True, stats=stats)

    def abort(self, req: Req) -> None:
        """Abort every unfinished choice of ``req``'s request, here and in the core."""
        reqs = self.live.pop(req.group_id, None)
        if reqs is None:
            return
        for r in reqs:
            if not r.finished:
                finish(r, "abort")
        self._post(m.Abort([req.group_id]))

    # -- requests --------------------------------------------------------------------

    def _submit(self, prompt: Prompt, params: SamplingParams, request_id: str | None, *, whole: bool) -> list[Req]:
        reqs = self._make(prompt, params, request_id, whole)
        self._send_add(reqs, params)
        return reqs

    def _make(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None,
        whole: bool,
        signal: Signal | None = None,
        wake_every: int | None = None,
    ) -> list[Req]:
        if self.failure is not None:
            raise EngineFailedError(str(self.failure))
        if self.broken is not None:
            raise EngineClosedError(f"the engine core is unavailable: {self.broken}")
        if self._closed or self._outbox is None or self._admission is None:
            raise EngineClosedError("the front end is not connected to the engine core; no requests are accepted")
        # The core owns the waiting queue and answers EngineOverloadedError itself.
        return self._admission.make_requests(
            prompt, params, request_id, waiting=0, whole=whole, signal=signal, wake_every=wake_every
        )

    def _send_add(self, reqs: list[Req], params: SamplingParams) -> None:
        rid = reqs[0].group_id
        self.live[rid] = reqs
        self._admitted[rid] = anyio.Event()
        self._post(m.Add(rid, list(reqs[0].prompt_ids), params, [r.seed for r in reqs]))

    async def _wait_admitted(self, rid: str) -> None:
        try:
            event = self._admitted.get(rid)
            if event is not None:
                await event.wait()
        finally:  # waited for or not (the caller cancelled), the request's entries go
            self._admitted.pop(rid, None)
            err = self._rejected.pop(rid, None)
        if err is not None:
            raise err

    def _post(self, msg: m.ToCore) -> None:
        if self._outbox is not None:
            self._outbox.send_nowait(msg)

    async def _query(self, what: str) -> Any:
        qid = next(self._qids)
        self._reply_events[qid] = event = anyio.Event()
        self._post(m.Query(qid, what))
        with anyio.fail_after(30):
            await event.wait()
        self._reply_events.pop(qid, None)
        return self._replies.pop(qid)

    # -- coroutines ------------------------------------------------------------------

    async def _send_loop(self, recv: MemoryObjectReceiveStream[m.ToCore]) -> None:
        async with recv:
            async for msg in recv:
                await self._sock.send(m.encode(msg))

    async def _heartbeat_loop(self) -> None:
        while True:
            self._post(m.Hello(ready=self._admission is not None))
            slept = time.monotonic()
            await anyio.sleep(HEARTBEAT_S)
            # Woken late, this loop was held up: the core's heartbeats may be waiting unread
            # behind it, so its silence is judged only after a beat on time.
            on_time = time.monotonic() - slept < 2 * HEARTBEAT_S
            if on_time and self._status is not None and time.monotonic() - self._last_status > CORE_TIMEOUT_S:
                self._core_gone(f"no heartbeat from the engine core for {CORE_TIMEOUT_S:.0f} s")
                return

    async def _monitor_loop(self) -> None:
        """The core's end of the connection closing is the core's death: notice it at once
        (the missing heartbeat is the backstop)."""
        from zmq.utils.monitor import parse_monitor_message

        monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_DISCONNECTED and self._welcome is not None:
                    self._core_gone("the connection to the engine core closed")
                    return
        finally:
            self._sock.disable_monitor()
            monitor.close(linger=0)

    def _core_gone(self, why: str) -> None:
        if self.dead.is_set():
            return
        log.error("engine_core_gone", reason=why)
        # After the engine's fault, that fault stays the reason given.
        self._fail_all(self.failure or EngineClosedError(f"the engine core is unavailable ({why})"))
        self.dead.set()

    def _core_failed(self, message: str) -> None:
        """The core's engine stopped after a fault: its requests are over and no new one is
        taken, while the core (and this front end) still run until it has closed."""
        if self.failure is not None:
            return
        log.error("engine_core_failed", error=message)
        self.failure = EngineFailedError(message)
        self._fail_all(self.failure)
        self.failed.set()

    def _forgotten_by_core(self) -> None:
        """A second Welcome: the core took this front end for gone (it sent nothing for longer
        than the core's timeout: a stopped or starved process) and aborted its requests, then
        met it again. Those requests end here with an error instead of waiting for ever; new
        ones are served as before."""
        log.warning("front_end_forgotten_by_core", aborted=sum(len(reqs) for reqs in self.live.values()))
        self._end_live(
            errors.RequestAbortedError("the engine core took this front end for gone and aborted its requests")
        )

    def _fail_all(self, error: AserveError) -> None:
        self.broken = error
        self._end_live(error)
        self.service_ready.set()  # nobody waits for readiness that will not come

    def _end_live(self, error: AserveError) -> None:
        """Every live request ends with ``error``; whoever waits for an admission wakes."""
        for reqs in list(self.live.values()):
            for req in reqs:
                if req.cell is not None and not req.finished:
                    req.finish_reason = "abort"
                    req.cell.fail(error)
        self.live.clear()
        for event in self._admitted.values():
            event.set()

    async def _receive_loop(self) -> None:
        while True:
            msg = m.decode_to_front_end(await self._sock.recv())
            if isinstance(msg, m.Outputs):
                if msg.rids:
                    deliver_columns(self.live, msg)
                deliver(self.live, msg.items, self._core_failed)
            elif isinstance(msg, m.Status):
                self._status = msg
                self._last_status = time.monotonic()
                if msg.failure is not None:
                    self._core_failed(msg.failure)
                if msg.ready:
                    self.service_ready.set()
            elif isinstance(msg, m.Accepted):
                event = self._admitted.get(msg.rid)
                if event is not None:
                    event.set()
            elif isinstance(msg, m.Rejected):
                err = error_from(msg.error, msg.message, msg.param)
                self._rejected[msg.rid] = err
                for req in self.live.pop(msg.rid, ()):
                    req.finish_reason = "abort"
                    if req.cell is not None:
                        req.cell.fail(err)
                event = self._admitted.get(msg.rid)
                if event is not None:
                    event.set()
            elif isinstance(msg, m.Welcome):
                if self._welcomed.is_set():
                    self._forgotten_by_core()
                self._welcome = msg
                self._last_status = time.monotonic()
                self._welcomed.set()
            elif isinstance(msg, m.Reply):
                self._replies[msg.qid] = msg.value
                event = self._reply_events.get(msg.qid)
                if event is not None:
                    event.set()

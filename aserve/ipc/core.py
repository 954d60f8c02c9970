"""The engine core's side of the wire: requests in from the front ends, outputs back, batched.

One ROUTER socket. Each front end (a DEALER whose identity names it) sends ``Add`` /
``Abort`` / ``Query`` / ``Hello``; the core answers ``Welcome`` to a front end's first ``Hello``
and sends every front end a ``Status`` heartbeat (at once, and from then on in every beat, when
the engine fails: every front end then answers 503 ``engine_failed``). A front end's requests share one wake-up
signal, so its sender coroutine wakes once per step (the commit pushes a whole step's tokens
synchronously) and sends one ``Outputs`` message with every choice that has something new:
never one message per token.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel
import zmq
import zmq.asyncio

from aserve import errors
from aserve.engine import Engine
from aserve.errors import AserveError, EngineFailedError
from aserve.ipc import messages as m
from aserve.logs import get_logger
from aserve.scheduler.req import Req
from aserve.sync import Signal

log = get_logger("aserve.core")

STATUS_INTERVAL_S = 0.25
# A front end silent this long is gone: its requests are aborted. A dead front end is known at
# once (the launcher sees its process end); this is for one that hangs, so it leaves room for a
# loop held up by seconds of synchronous work (a first grammar on a loaded machine took 3 s).
FRONT_END_TIMEOUT_S = 15.0


class _FrontEnd:
    def __init__(self, identity: bytes) -> None:
        self.identity = identity
        self.live: dict[str, dict[int, Req]] = {}  # rid -> its choices not yet delivered in full
        self.signal = Signal()
        self.last_seen = time.monotonic()
        self.ready = False


class CoreService:
    """Serves ``engine`` to front-end processes at ``address`` while ``running()`` is entered."""

    def __init__(self, engine: Engine, address: str, expected_front_ends: int = 1) -> None:
        self.engine = engine
        self.address = address
        self.expected_front_ends = expected_front_ends
        self.service_ready = False  # latched once every expected front end was ready
        self.front_ends: dict[bytes, _FrontEnd] = {}
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a departed front end's messages are dropped
        # A ROUTER drops (not blocks) at its high-water mark: a front end that falls behind must
        # get its outputs late, never lose them. Memory, not correctness, is what a slow one costs.
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._tg: anyio.abc.TaskGroup | None = None
        self.messages_sent = 0
        self.outputs_sent = 0  # of them, ``Outputs`` (a step's news for one front end)
        self.failure: EngineFailedError | None = None  # the engine's fault, once it happened
        self.failure_told = anyio.Event()  # every front end was sent it

    @asynccontextmanager
    async def running(self) -> AsyncIterator[CoreService]:
        self._sock.bind(self.address)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._receive_loop, name="aserve.core.receive")
                tg.start_soon(self._status_loop, name="aserve.core.status")
                tg.start_soon(self._failure_loop, name="aserve.core.failure")
                try:
                    yield self
                finally:
                    tg.cancel_scope.cancel()
        finally:
            for fe in list(self.front_ends.values()):
                self._abort_all(fe)
            self._sock.close(linger=0)
            self._ctx.term()

    def drop(self, identity: bytes) -> None:
        """A front end is gone (its process died, or it said ``Bye``): abort its requests."""
        fe = self.front_ends.pop(identity, None)
        if fe is not None:
            n = self._abort_all(fe)
            log.warning("front_end_gone", front_end=identity.decode(errors="replace"), aborted=n)

    def _abort_all(self, fe: _FrontEnd) -> int:
        n = 0
        for choices in fe.live.values():
            for req in choices.values():
                if not req.finished:
                    self.engine.abort(req)
                    n += 1
        fe.live.clear()
        fe.signal.set()
        return n

    async def _send(self, fe: _FrontEnd, msg: m.ToFrontEnd) -> None:
        await self._sock.send_multipart([fe.identity, m.encode(msg)])
        self.messages_sent += 1
        if isinstance(msg, m.Outputs):
            self.outputs_sent += 1

    # -- coroutines ------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        while True:
            identity, data = await self._sock.recv_multipart()
            fe = self.front_ends.get(identity)
            if fe is None:
                fe = self.front_ends[identity] = _FrontEnd(identity)
                assert self._tg is not None
                self._tg.start_soon(self._send_loop, fe, name=f"aserve.core.send[{identity.decode()}]")
                await self._send(fe, self._welcome())
            fe.last_seen = time.monotonic()
            try:
                msg = m.decode_to_core(data)
            except Exception as exc:  # our own front ends send only valid messages; never crash the core
                log.error("bad_message", front_end=identity.decode(errors="replace"), error=str(exc))
                continue
            if isinstance(msg, m.Add):
                await self._add(fe, msg)
            elif isinstance(msg, m.Abort):
                for rid in msg.rids:
                    for req in fe.live.pop(rid, {}).values():
                        self.engine.abort(req)
            elif isinstance(msg, m.Query):
                await self._send(fe, m.Reply(msg.qid, self._answer(msg.what)))
            elif isinstance(msg, m.Bye):
                self.drop(identity)
            elif isinstance(msg, m.Hello) and msg.ready and not fe.ready:
                fe.ready = True
                if not self.service_ready:
                    ready = sum(1 for f in self.front_ends.values() if f.ready)
                    self.service_ready = ready >= self.expected_front_ends
                    if self.service_ready:
                        log.info("service_ready", front_ends=ready)
                        for f in list(self.front_ends.values()):  # tell them now, not at the next beat
                            await self._send(f, self._status())

    async def _add(self, fe: _FrontEnd, msg: m.Add) -> None:
        try:
            reqs = self.engine.submit(msg.prompt_ids, msg.params, msg.rid, seeds=msg.seeds, signal=fe.signal)
        except AserveError as exc:
            await self._send(fe, m.Rejected(msg.rid, type(exc).__name__, str(exc), getattr(exc, "param", None)))
            return
        except Exception as exc:  # a bug must cost one request, not the core's receive loop
            log.error("add_failed", rid=msg.rid, error=repr(exc))
            await self._send(fe, m.Rejected(msg.rid, "RequestAbortedError", f"the engine could not take it: {exc}"))
            return
        fe.live[msg.rid] = {r.index: r for r in reqs}
        await self._send(fe, m.Accepted(msg.rid))

    async def _send_loop(self, fe: _FrontEnd) -> None:
        """One ``Outputs`` message per wake-up (per step) with every choice that has news."""
        while self.front_ends.get(fe.identity) is fe:
            msg = collect_outputs(fe.live)
            if msg is not None:
                await self._send(fe, msg)
            else:
                await fe.signal.wait()
                # The commit that woke us then frees a pipeline slot, which wakes the planner
                # after us: let it plan and launch the next step before we collect (the
                # device waits for that launch; the front end waits a few microseconds more).
                await anyio.lowlevel.checkpoint()

    async def _status_loop(self) -> None:
        last_beat = time.monotonic()
        while True:
            now = time.monotonic()
            # A beat that comes late means this loop was held up (a long synchronous stretch):
            # the front ends' messages wait unread behind it, so their silence proves nothing
            # until the receive loop has had its turn. Judge them at the next beat.
            judge = now - last_beat < 4 * STATUS_INTERVAL_S
            last_beat = now
            status = None  # one snapshot a beat for every front end: the stats walk the engine
            for fe in list(self.front_ends.values()):
                if judge and now - fe.last_seen > FRONT_END_TIMEOUT_S:
                    self.drop(fe.identity)
                    continue
                if status is None:
                    status = self._status()
                with contextlib.suppress(zmq.ZMQError):
                    await self._send(fe, status)
            await anyio.sleep(STATUS_INTERVAL_S)

    async def _failure_loop(self) -> None:
        """Tell every front end the moment the engine fails, not at the next beat: their
        /health and new requests answer 503 ``engine_failed`` from then on, while the
        engine closes, instead of 200 until this process exits."""
        self.failure = await self.engine.wait_failed()
        for fe in list(self.front_ends.values()):
            with contextlib.suppress(zmq.ZMQError):
                await self._send(fe, self._status())
        self.failure_told.set()

    def _status(self) -> m.Status:
        failure = None if self.failure is None else str(self.failure)
        return m.Status(ready=self.service_ready, stats=self.engine.stats().as_dict(), failure=failure)

    def _welcome(self) -> m.Welcome:
        e = self.engine
        info = e.info()
        return m.Welcome(
            model=e.config.model,
            model_path=info["model"],
            vocab_size=e.model_config.vocab_size,
            max_context=e.max_context,
            kv_tokens=info["kv_tokens"],
            eos_token_ids=list(e.eos_token_ids),
            max_waiting_requests=e.config.max_waiting_requests,
            info=info,
        )

    def _answer(self, what: str) -> object:
        if what == "flush_cache":
            return self.engine.flush_cache()
        if what == "stats":
            return self.engine.stats().as_dict()
        return None


def collect_outputs(live: dict[str, dict[int, Req]], columns: bool = True) -> m.Outputs | None:
    """What a front end's choices (``live``: request id, then choice index) have new since the
    last call, as one message, or None. A choice whose end it carries leaves ``live``.
    ``columns=False`` sends every choice as an item (the form before columns; for
    ``aserve.bench.ipc_outputs``)."""
    items: list[m.Output] = []
    ended: list[tuple[str, int]] = []
    rids: list[str] = []
    indexes: list[int] = []
    counts: list[int] = []
    tokens: list[int] = []
    cached: list[int] = []
    for rid, choices in live.items():
        for index, req in choices.items():
            cell = req.cell
            if cell is None:
                continue
            ids = cell.token_ids
            if (
                columns
                and ids
                and not cell.finished
                and cell.pushed > len(ids)
                and cell.prompt_logprobs is None
                and req.params.logprobs is None
            ):
                # Not its first tokens, not its end, no logprobs: a stream's next tokens, in
                # columns once its interval is full.
                if cell.wake_every and len(ids) >= cell.wake_every:
                    rids.append(rid)
                    indexes.append(index)
                    counts.append(len(ids))
                    tokens += ids
                    cached.append(req.cached_prompt_tokens)
                    cell.token_ids = []
                continue
            if not (ids or cell.finished):
                continue  # nothing new
            out = _take(rid, req)
            if out is None:
                continue
            items.append(out)
            if out.finish_reason is not None or out.error is not None:
                ended.append((rid, index))  # its last message
    for rid, index in ended:
        choices = live[rid]
        del choices[index]
        if not choices:
            del live[rid]
    if not (items or rids):
        return None
    return m.Outputs(items, rids, indexes, counts, tokens, cached)


def _take(rid: str, req: Req) -> m.Output | None:
    """What a choice's cell holds that the front end has not seen, or None."""
    cell = req.cell
    if cell is None or not cell.ready():
        return None
    finished = cell.finished
    ids, lps = cell.take_nowait()
    if not ids and not finished:
        return None
    if not finished and req.params.logprobs is None and cell.prompt_logprobs is None:
        # The common case, a stream's next tokens: positional fields (the keyword form and
        # the branches below cost ~0.4 us a choice, 256 choices a step).
        return m.Output(rid, req.index, ids, None, None, None, None, req.cached_prompt_tokens)
    error = cell.error
    prompt_lps = None
    # The choice's first tokens, or its end without any (max_tokens 0: only the prompt's logprobs).
    if (ids or finished) and cell.pushed == len(ids) and cell.prompt_logprobs is not None:
        prompt_lps = [None if lp is None else (lp.token_id, lp.logprob, list(lp.top)) for lp in cell.prompt_logprobs]
    return m.Output(
        rid=rid,
        index=req.index,
        token_ids=ids,
        finish_reason=cell.finish_reason if finished else None,
        stop_reason=cell.stop_reason if finished else None,
        text_limit=cell.text_limit if finished else None,
        logprobs=[(lp.token_id, lp.logprob, list(lp.top)) for lp in lps] if req.params.logprobs is not None else None,
        cached_tokens=req.cached_prompt_tokens,
        prompt_logprobs=prompt_lps,
        error=None if error is None else type(error).__name__,
        error_message=None if error is None else str(error),
    )


def error_class(name: str) -> type[AserveError]:
    cls = getattr(errors, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, AserveError) else errors.RequestAbortedError

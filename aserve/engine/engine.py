"""The public face: ``async with aserve.Engine(...) as engine``.

One anyio task group holds the engine's coroutines:

    ingest ──► waiting queue ──► plan+launch ──► in-flight channel ──► commit ──► output cells
                                     ▲                                   │
                                     └──────── pipeline slots ◄──────────┘

Planning a step and committing a step are each one synchronous stretch with no ``await``
inside; awaits sit only at the edges (taking a slot, awaiting a device event, sending on a
channel). That is the lock that keeps the planner and the committer from seeing a ``Req``
half-updated by the other.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from types import TracebackType
from typing import Any

import anyio
import torch
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aserve.config import EngineConfig
from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.events import CpuStream, CudaEventWaiter, DeviceError, LoopWaker
from aserve.device.future_map import FutureMap
from aserve.device.runner import ModelRunner, Step
from aserve.engine.commit import Committer
from aserve.engine.pipeline import PipelineSlots, Signal
from aserve.engine.setup import LoadedEngine, load_engine_parts
from aserve.errors import (
    ContextLengthError,
    EngineClosedError,
    EngineOverloadedError,
    InvalidRequestError,
    RequestAbortedError,
)
from aserve.logs import get_logger
from aserve.outputs import CompletionOutput, CompletionResult, Delta, OutputCell, TokenLogprob, Usage
from aserve.sampling_params import SamplingParams
from aserve.scheduler.policy import Blocked, Plan, Scheduler, SchedulerConfig
from aserve.scheduler.req import Req
from aserve.stats import EngineStats, StepRecord, StepStats, TraceWriter
from aserve.tokenizer.detokenizer import IncrementalDetokenizer
from aserve.tokenizer.tokenizer import Tokenizer

log = get_logger("aserve.engine")

Prompt = str | Sequence[int]


class Engine:
    """An LLM engine embedded in the current event loop (asyncio or trio, through anyio).

    Create it with an :class:`EngineConfig` or its fields as keyword arguments, and enter it
    with ``async with``: the model loads (in a worker thread, so the loop stays responsive),
    the KV pool is sized, and the scheduler's coroutines start. Leaving the block cancels
    them and ends every unfinished request with ``finish_reason == "abort"``.
    """

    def __init__(self, config: EngineConfig | None = None, /, **kwargs: Any) -> None:
        if config is None:
            config = EngineConfig.from_kwargs(**kwargs)
        elif kwargs:
            raise TypeError("pass either an EngineConfig or keyword options, not both")
        self.config = config
        self._parts: LoadedEngine | None = None
        self._tg: TaskGroup | None = None
        self._closed = False
        self._broken: BaseException | None = None
        self._ids = itertools.count()
        self._rng = random.Random(config.seed)
        self._work = Signal()
        self._stats = StepStats()
        self._trace: TraceWriter | None = None
        self._t0 = time.perf_counter()
        self._prev_end: Any = None  # device event that ended the previous step
        self._idle_before_next = True
        self.requests_finished = 0
        self.requests_aborted = 0
        self.prompt_tokens = 0
        self._live: set[Req] = set()
        self._gc_frozen = False

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Load the model and start the scheduler. Prefer ``async with``."""
        cfg = self.config
        if cfg.num_threads is not None:
            torch.set_num_threads(cfg.num_threads)
        self._waker = LoopWaker()
        self._cpu_stream: CpuStream | None = None
        self._cuda_waiter: CudaEventWaiter | None = None
        if cfg.torch_device.type == "cpu":
            # All heavy torch work on the CPU backend runs on the stream's worker thread,
            # loading included: a second thread running parallel torch ops keeps its own
            # OpenMP team, and on a small machine the two teams slow each other (measured
            # 45 vs 86 ms per decode step on 2 cores).
            self._cpu_stream = CpuStream(self._waker)
            self._parts = await self._load_on_stream(self._cpu_stream, cfg)
        else:
            self._parts = await anyio.to_thread.run_sync(load_engine_parts, cfg)
        parts = self._parts
        if parts.device.type == "cuda" and cfg.cuda_event_wait == "thread":
            self._cuda_waiter = CudaEventWaiter(self._waker)
        self.scheduler = Scheduler(
            parts.pool,
            SchedulerConfig(
                max_num_batched_tokens=cfg.max_num_batched_tokens,
                max_running_requests=cfg.max_running_requests,
                max_waiting_requests=cfg.max_waiting_requests,
                radix_cache=cfg.radix_cache,
                debug=cfg.debug,
                schedule_policy=cfg.schedule_policy,
                max_lookahead=cfg.pipeline_depth - 1,
            ),
        )
        # One mailbox per request row, plus the spare row padded decode-graph rows use.
        self.future_map = FutureMap(parts.pool.rows.num_rows + 1, parts.device, cfg.debug)
        self.runner = ModelRunner(
            parts.model,
            parts.pool,
            parts.device,
            self.future_map,
            self._cpu_stream,
            self._cuda_waiter,
            cfg.resolved_attention_backend,
            DecodeGraphs(parts.model, parts.pool, self.future_map, parts.device, cfg.max_running_requests)
            if cfg.use_cuda_graph
            else None,
            pipeline_depth=cfg.pipeline_depth,
        )
        if self.runner.decode_graphs is not None and parts.device.type == "cuda":
            self.runner.decode_graphs.capture(self.runner.forward_stream)
        self.committer = Committer(self.scheduler, parts.tokenizer, self._on_finish)
        self._slots = PipelineSlots(cfg.pipeline_depth)
        send: MemoryObjectSendStream[Step]
        recv: MemoryObjectReceiveStream[Step]
        send, recv = anyio.create_memory_object_stream[Step](cfg.pipeline_depth)
        ingest_send, ingest_recv = anyio.create_memory_object_stream[list[Req]](math.inf)
        self._ingest_send = ingest_send
        if cfg.trace_path:
            self._trace = TraceWriter(cfg.trace_path, self._t0)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._ingest_loop, ingest_recv, name="aserve.ingest")
        self._tg.start_soon(self._plan_loop, send, name="aserve.plan_launch")
        self._tg.start_soon(self._commit_loop, recv, name="aserve.commit")
        log.info(
            "engine_started",
            model=str(parts.model_path),
            device=str(parts.device),
            dtype=str(parts.dtype).removeprefix("torch."),
            kv_tokens=parts.pool.total_tokens,
            kv_gib=round(parts.pool.total_tokens * parts.pool.bytes_per_token() / 2**30, 2),
            max_context=parts.pool.max_context,
            full_context_requests=parts.pool.total_tokens // parts.pool.max_context,
            max_running_requests=cfg.max_running_requests,
            overlap=cfg.overlap,
            pipeline_depth=cfg.pipeline_depth,
            attention=cfg.resolved_attention_backend,
            fused_ops=cfg.use_fused_ops,
            cuda_graph=cfg.use_cuda_graph,
            gc_freeze=cfg.use_gc_freeze,
            load_s=round(parts.load_s, 2),
        )
        if cfg.warmup:
            # A greedy and a sampled request in one batch: the first use of the sampler's ops
            # (top-k/p, penalties, logprobs) is slow on CUDA (H200: a 0.2 s launch), and would
            # otherwise land on the first user request that samples.
            bos = parts.tokenizer.bos_token_id
            prompt = [bos if bos is not None else 0] * 4
            sampled = SamplingParams(max_tokens=2, temperature=0.8, top_k=40, top_p=0.9, min_p=0.01, seed=0,
                                     repetition_penalty=1.1, logprobs=1)  # fmt: skip
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.complete, prompt, SamplingParams(max_tokens=2, temperature=0))
                tg.start_soon(self.complete, prompt, sampled)
            self._stats.reset()
        if cfg.use_gc_freeze:
            # Start-up garbage is collected first, so nothing dead is kept alive by the freeze.
            gc.collect()
            gc.freeze()
            self._gc_frozen = True

    @staticmethod
    async def _load_on_stream(stream: CpuStream, cfg: EngineConfig) -> LoadedEngine:
        box: dict[str, Any] = {}

        def load() -> None:
            try:
                box["parts"] = load_engine_parts(cfg)
            except BaseException as exc:  # re-raised on the loop, with its own type
                box["error"] = exc

        stream.submit(load)
        try:
            await stream.record("engine.loaded").wait()
        except BaseException:
            stream.close()
            raise
        if "error" in box:
            stream.close()
            raise box["error"]
        return box["parts"]  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Stop the scheduler; unfinished requests end with ``finish_reason == "abort"``."""
        if self._closed:
            return
        self._closed = True
        for req in list(self._live):
            if not req.finished:
                self.committer.finish(req, "abort")
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)
            self._tg = None
        # The loops are gone; steps still queued on the device finish before the stream
        # thread exits below. Return every request's KV so the ledger closes.
        if self._cpu_stream is not None:
            self._cpu_stream.close()
            self._cpu_stream = None
        if self._parts is not None and self._parts.device.type == "cuda":
            torch.cuda.synchronize(self._parts.device)
        if hasattr(self, "scheduler"):
            self.scheduler.release_all()
        if self._cuda_waiter is not None:
            self._cuda_waiter.close()
        if self._trace is not None:
            self._trace.write()
        if self._gc_frozen:
            gc.unfreeze()  # process-wide: what was frozen is the collector's again
            self._gc_frozen = False

    # -- public API --------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        return self._require().tokenizer

    @property
    def model_config(self) -> Any:
        return self._require().model_config

    @property
    def max_context(self) -> int:
        return self._require().pool.max_context

    def info(self) -> dict[str, Any]:
        parts = self._require()
        pool = parts.pool
        return {
            "model": str(parts.model_path),
            "architecture": parts.model_config.architecture,
            "device": str(parts.device),
            "dtype": str(parts.dtype).removeprefix("torch."),
            "kv_tokens": pool.total_tokens,
            "kv_bytes_per_token": pool.bytes_per_token(),
            "page_size": pool.page_size,
            "max_context": pool.max_context,
            "max_running_requests": self.config.max_running_requests,
            "full_context_requests_that_fit": pool.total_tokens // pool.max_context,
            "overlap": self.config.overlap,
            "attention_backend": self.config.resolved_attention_backend,
            "fused_ops": self.config.use_fused_ops,
            "cuda_graph": self.config.use_cuda_graph,
            "load_s": round(parts.load_s, 2),
        }

    async def complete(
        self, prompt: Prompt, params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> CompletionResult:
        """Generate to the end and return the whole result.

        Cancelling the calling task aborts the request and frees its KV at the next commit.
        Raises :class:`InvalidRequestError` (or a subclass) for bad input, before anything runs.
        """
        params = params or SamplingParams()
        # Woken once per finished choice, not per token: with many requests in flight, a
        # wake-up per request per step was host time taken from the planner and committer.
        reqs = self._make_requests(prompt, params, request_id, whole=True)
        outputs = [CompletionOutput(index=i, text="", token_ids=[], finish_reason=None) for i in range(params.n)]
        logprobs: list[list[TokenLogprob]] = [[] for _ in range(params.n)]
        # Token ids only while it runs: the text is decoded once at the end, which keeps
        # per-token detokenization off the event loop that plans and commits steps.
        async with contextlib.aclosing(self._stream(reqs, detokenize=False)) as stream:
            async for delta in stream:
                out = outputs[delta.index]
                out.token_ids.extend(delta.token_ids)
                if delta.logprobs:
                    logprobs[delta.index].extend(delta.logprobs)
                if delta.finish_reason is not None:
                    out.finish_reason = delta.finish_reason
                    out.stop_reason = delta.stop_reason
        for req, out, lps in zip(reqs, outputs, logprobs, strict=True):
            text = self.tokenizer.decode(out.token_ids, params.skip_special_tokens)
            out.text = text if req.cell.text_limit is None else text[: req.cell.text_limit]
            out.logprobs = lps if params.logprobs is not None else None
        first = reqs[0]
        metrics: dict[str, float] = {}
        if first.first_token_time is not None:
            metrics["ttft_s"] = first.first_token_time - first.arrival
        if first.finish_time is not None:
            metrics["e2e_s"] = first.finish_time - first.arrival
        return CompletionResult(
            request_id=first.group_id,
            prompt_token_ids=list(first.prompt_ids),
            outputs=outputs,
            usage=Usage(len(first.prompt_ids), sum(len(o.token_ids) for o in outputs), first.cached_prompt_tokens),
            metrics=metrics,
        )

    async def generate(
        self, prompt: Prompt, params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> AsyncIterator[Delta]:
        """Stream deltas as tokens are committed.

        Validation happens on the first iteration. Cancelling the consuming task, or closing
        the generator (``async with contextlib.aclosing(engine.generate(...)) as g``, or
        dropping it after ``break``), aborts the request; its KV is freed once no step in
        flight still reads it. A plain ``break`` out of ``async for`` leaves the generator
        to be closed when it is collected; use ``aclosing`` for a deterministic abort.
        """
        reqs = self._make_requests(prompt, params or SamplingParams(), request_id)
        # aclosing: when our consumer stops early, close the inner generator now, so its
        # ``finally`` aborts the request at once instead of whenever it is collected.
        async with contextlib.aclosing(self._stream(reqs)) as stream:
            async for delta in stream:
                yield delta

    def open_stream(
        self, prompt: Prompt, params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> RequestStream:
        """Validate and submit now, then stream: bad input raises here, before any await.

        Servers use it to answer admission errors with a status before sending headers,
        and to start the response at once. ``await stream.aclose()`` aborts the request
        whether or not iteration has started.
        """
        reqs = self._make_requests(prompt, params or SamplingParams(), request_id)
        self._submit(reqs)
        return RequestStream(self, reqs)

    def stats(self) -> EngineStats:
        ledger = self.ledger()
        st = self._stats
        prefix = self.scheduler.prefix
        ps = ledger.page_size
        return EngineStats(
            running=sum(1 for r in self.scheduler.running if not r.finished),
            waiting=len(self.scheduler.waiting),
            kv_total_tokens=ledger.total_pages * ps,
            kv_free_tokens=ledger.free_pages * ps,
            kv_used_tokens=ledger.in_use_pages * ps,
            kv_ledger_balanced=ledger.balanced,
            rows_total=ledger.total_rows,
            rows_free=ledger.free_rows,
            pipeline_depth=self._slots.depth,
            pipeline_in_use=self._slots.in_use,
            num_steps=st.num_steps,
            num_retractions=self.scheduler.num_retractions,
            requests_finished=self.requests_finished,
            requests_aborted=self.requests_aborted,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.committer.output_tokens,
            device_busy_s=st.device_busy_s,
            device_gap_s=st.device_gap_s,
            host_plan_s=st.plan_s,
            host_launch_s=st.launch_s,
            host_commit_s=st.commit_s,
            median_device_gap_s=st.median_gap(),
            median_decode_gap_s=st.median_gap(decode_only=True),
            cache_hit_tokens=prefix.hit_tokens,
            cache_queried_tokens=prefix.queried_tokens,
            cached_tokens=prefix.num_cached_pages * ps,
            cache_evicted_tokens=prefix.tree.num_evicted_pages * ps,
            prefill_tokens_computed=self.scheduler.prefill_tokens_computed,
        )

    def step_records(self) -> list[StepRecord]:
        return list(self._stats.records)

    def reset_stats(self) -> None:
        self._stats.reset()

    def ledger(self) -> Any:
        """KV accounting: ``free + used == total``; ``cached`` pages (the prefix cache) are
        part of ``used``; ``all_free`` means no request holds anything."""
        return self._require().pool.ledger(cached_pages=self.scheduler.prefix.num_cached_pages)

    def flush_cache(self) -> int:
        """Drop the prefix cache; only when nothing runs. Returns the tokens freed, or -1."""
        if self.scheduler.running or self.scheduler.waiting:
            return -1
        return self.scheduler.prefix.flush() * self.scheduler.pool.page_size

    # -- requests ---------------------------------------------------------------

    def _require(self) -> LoadedEngine:
        if self._parts is None:
            raise EngineClosedError("the engine is not started; use `async with Engine(...)`")
        return self._parts

    def _make_requests(
        self, prompt: Prompt, params: SamplingParams, request_id: str | None, *, whole: bool = False
    ) -> list[Req]:
        """Validated requests for ``prompt``. ``whole=True`` (``complete``): the consumer is
        woken only when a choice finishes; otherwise every ``stream_interval`` tokens."""
        parts = self._require()
        if self._closed:
            raise EngineClosedError("the engine is shutting down; no new requests are accepted")
        if self._broken is not None:
            raise EngineClosedError(f"the engine stopped after a device error: {self._broken}")
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be an aserve.SamplingParams", param="params")
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt is empty; give at least one character or token", param="prompt")
            ids = parts.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            ids = list(prompt)
            if not ids:
                raise InvalidRequestError("prompt is empty; give at least one token id", param="prompt")
            vocab = parts.model_config.vocab_size
            bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
            if bad:
                raise InvalidRequestError(
                    f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}", param="prompt"
                )
        if params.logit_bias:
            vocab = parts.model_config.vocab_size
            outside = [t for t, _ in params.logit_bias if t >= vocab]
            if outside:
                raise InvalidRequestError(
                    f"logit_bias token ids must be in [0, {vocab}); got {outside[:5]}", param="logit_bias"
                )
        ctx = parts.pool.max_context
        if len(ids) >= ctx:
            raise ContextLengthError(
                f"prompt has {len(ids)} tokens but the context holds {ctx} "
                f"(prompt + at least 1 output token); shorten the prompt",
                param="prompt",
            )
        if len(ids) + 1 > parts.pool.total_tokens:
            raise ContextLengthError(
                f"prompt has {len(ids)} tokens but the KV pool holds only {parts.pool.total_tokens}; "
                "shorten the prompt or give the engine more KV memory",
                param="prompt",
            )
        # Count requests submitted but not yet admitted (still in the ingest channel) too.
        waiting = sum(1 for r in self._live if r.row is None)
        if waiting + params.n > self.config.max_waiting_requests:
            raise EngineOverloadedError(
                f"{waiting} requests are waiting (limit {self.config.max_waiting_requests}); retry later"
            )
        rid = request_id or f"req-{next(self._ids)}"
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(parts.eos_token_ids)
        signal = Signal()
        reqs = []
        for i in range(params.n):
            seed = params.seed + i if params.seed is not None else self._rng.getrandbits(63)
            reqs.append(
                Req(
                    rid=rid if params.n == 1 else f"{rid}.{i}",
                    index=i,
                    prompt_ids=ids,
                    params=params,
                    # Clip to the context and to the pool: one request never needs more KV
                    # than the whole pool holds.
                    max_new_tokens=min(params.max_tokens, ctx - len(ids), parts.pool.total_tokens - len(ids)),
                    group_id=rid,
                    seed=seed,
                    stop_ids=frozenset(stop_ids),
                    cell=OutputCell(signal, wake_every=0 if whole else self.config.stream_interval),
                )
            )
        return reqs

    async def _stream(
        self, reqs: list[Req], submitted: bool = False, detokenize: bool = True
    ) -> AsyncGenerator[Delta, None]:
        """Submit ``reqs`` and yield their deltas; aborts them if the consumer goes away.

        ``detokenize=False``: deltas carry token ids only (``text`` stays empty)."""
        tok = self.tokenizer
        if not submitted:
            self._submit(reqs)
        signal = reqs[0].cell.signal
        params = reqs[0].params
        detoks = [IncrementalDetokenizer(tok, skip_special_tokens=params.skip_special_tokens) for _ in reqs]
        detoks = detoks if detokenize else []
        hold = max((len(s) for s in params.stop), default=1) - 1
        emitted = [0] * len(reqs)
        done = [False] * len(reqs)
        try:
            while not all(done):
                progressed = False
                for i, req in enumerate(reqs):
                    if done[i]:
                        continue
                    cell = req.cell
                    if not cell.ready():
                        continue
                    finished = cell.finished
                    ids, lps = cell.take_nowait()
                    if cell.error is not None:
                        raise RequestAbortedError(f"request {req.rid} failed: {cell.error}") from cell.error
                    new_text = ""
                    if detokenize:
                        detok = detoks[i]
                        detok.push(ids)
                        if finished:
                            detok.flush()
                        text = detok.text
                        if finished:
                            limit = len(text) if cell.text_limit is None else cell.text_limit
                        else:
                            limit = len(text) - hold
                        new_text = text[emitted[i] : limit] if limit > emitted[i] else ""
                        emitted[i] = max(emitted[i], limit)
                    progressed = True
                    if finished:
                        done[i] = True
                    if not ids and not new_text and not finished:
                        continue
                    yield Delta(
                        index=req.index,
                        text=new_text,
                        token_ids=ids,
                        finish_reason=cell.finish_reason if finished else None,
                        stop_reason=cell.stop_reason if finished else None,
                        logprobs=lps if params.logprobs is not None else None,
                    )
                if not progressed:
                    await signal.wait()
        finally:
            for req in reqs:
                if not req.finished:
                    self._abort(req)

    def _submit(self, reqs: list[Req]) -> None:
        now = time.perf_counter()
        for r in reqs:
            r.arrival = now
            self._live.add(r)
            if self._trace is not None:
                self._trace.request_state(r.rid, "queued", now)
        self.prompt_tokens += len(reqs[0].prompt_ids)
        self._ingest_send.send_nowait(reqs)

    def _abort(self, req: Req) -> None:
        if req.finished:
            return
        req.abort_requested = True
        self.committer.finish(req, "abort")
        if not self.scheduler.remove_waiting(req):
            self.scheduler.release_if_done(req)
        self._work.set()

    def _on_finish(self, req: Req) -> None:
        self._live.discard(req)
        if req.finish_reason == "abort":
            self.requests_aborted += 1
        else:
            self.requests_finished += 1
        ttft = None if req.first_token_time is None else round(req.first_token_time - req.arrival, 6)
        e2e = None if req.finish_time is None else round(req.finish_time - req.arrival, 6)
        if self._trace is not None and req.finish_time is not None:
            self._trace.request_state(req.rid, f"finished:{req.finish_reason}", req.finish_time)
        log.info(
            "request_end",
            rid=req.rid,
            prompt_tokens=len(req.prompt_ids),
            output_tokens=len(req.output_ids),
            finish_reason=req.finish_reason,
            ttft_s=ttft,
            e2e_s=e2e,
            retractions=req.num_retractions,
        )

    # -- coroutines --------------------------------------------------------------

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
                self._work.set()

    async def _plan_loop(self, send: MemoryObjectSendStream[Step]) -> None:
        async with send:
            while self._broken is None:
                await self._slots.acquire()
                t0 = time.perf_counter()
                while True:
                    self._end_stuck()
                    result = self.scheduler.schedule(pipeline_busy=self._slots.in_use > 1)
                    if isinstance(result, Plan):
                        break
                    self._slots.release()
                    if result is Blocked.DRAIN:
                        # KV is short while steps are in flight: commit them all, then
                        # plan again with everything settled (retraction needs a drained pipeline).
                        await self._slots.wait_until(0)
                    elif self.scheduler.stuck:
                        pass  # end them at the top of the next pass, without waiting
                    else:
                        if self._slots.in_use == 0:
                            self._idle_before_next = True
                        await self._work.wait()
                    await self._slots.acquire()
                    t0 = time.perf_counter()
                plan_s = time.perf_counter() - t0
                step = self.runner.launch(result, plan_s)
                if self.config.debug:
                    self._track_pages(step, result, +1)
                for seq in result.seqs:
                    seq.req.inflight += 1
                    if self._trace is not None and seq.prefix_len == 0:
                        self._trace.request_state(seq.req.rid, "running", step.launch_time)
                step.depth_in_use = self._slots.in_use
                step.after_idle = self._idle_before_next
                self._idle_before_next = False
                try:
                    await send.send(step)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the committer stopped after a device error; the engine is broken

    async def _commit_loop(self, recv: MemoryObjectReceiveStream[Step]) -> None:
        async with recv:
            async for step in recv:
                try:
                    await step.copied.wait()
                except DeviceError as exc:
                    self._fail_everything(exc)
                    return
                t0 = time.perf_counter()
                if self.config.debug:
                    self._track_pages(step, None, -1)
                self.committer.commit(step)
                commit_s = time.perf_counter() - t0
                self._record(step, commit_s, t0)
                self._slots.release()
                self._work.set()

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

    def _end_stuck(self) -> None:
        while self.scheduler.stuck:
            req = self.scheduler.stuck.pop()
            log.warning(
                "kv_exhausted", rid=req.rid, tokens=req.num_computed, kv_tokens=self.scheduler.pool.total_tokens
            )
            if not req.finished:
                self.committer.finish(req, "length")
            self.scheduler.release_if_done(req)

    def _fail_everything(self, exc: BaseException) -> None:
        log.error("device_error", error=repr(exc.__cause__ or exc))
        self._broken = exc
        for req in list(self._live):
            req.cell.fail(exc)

    def _record(self, step: Step, commit_s: float, commit_t0: float) -> None:
        begin, end = step.forward_begin, step.materialized
        if begin.cuda_event is not None and end.cuda_event is not None:
            busy = begin.cuda_event.elapsed_time(end.cuda_event) / 1e3
            gap = None
            if self._prev_end is not None and not step.after_idle:
                gap = self._prev_end.cuda_event.elapsed_time(begin.cuda_event) / 1e3
        else:
            busy = end.host_time - begin.host_time
            gap = None
            if self._prev_end is not None and not step.after_idle:
                gap = max(0.0, begin.host_time - self._prev_end.host_time)
        self._prev_end = end
        self._stats.add(
            StepRecord(
                index=step.index,
                num_seqs=len(step.entries),
                num_tokens=step.num_tokens,
                num_decodes=step.num_decodes,
                depth_in_use=step.depth_in_use,
                device_busy_s=busy,
                device_gap_s=gap,
                plan_s=step.plan_s,
                launch_s=step.launch_s,
                commit_s=commit_s,
            )
        )
        if self._trace is not None:
            tr = self._trace
            tr.span("plan", tr.HOST, step.launch_time - step.plan_s, step.launch_time, step=step.index)
            tr.span("launch", tr.HOST, step.launch_time, step.launch_time + step.launch_s, step=step.index)
            tr.span("commit", tr.HOST, commit_t0, commit_t0 + commit_s, step=step.index)
            if begin.cuda_event is None:
                tr.span(
                    f"step {step.index}",
                    tr.DEVICE,
                    begin.host_time,
                    end.host_time,
                    seqs=len(step.entries),
                    tokens=step.num_tokens,
                )


class RequestStream:
    """Deltas of a submitted request (``Engine.open_stream``); ``aclose`` aborts it."""

    def __init__(self, engine: Engine, reqs: list[Req]) -> None:
        self._engine = engine
        self._reqs = reqs
        self._gen = engine._stream(reqs, submitted=True)

    @property
    def request_id(self) -> str:
        return self._reqs[0].group_id

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (0 until the request is admitted)."""
        return self._reqs[0].cached_prompt_tokens

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        """Abort the request if unfinished (at once, started or not) and close the stream."""
        for req in self._reqs:
            if not req.finished:
                self._engine._abort(req)
        await self._gen.aclose()

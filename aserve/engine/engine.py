"""The public face: ``async with aserve.Engine(...) as engine``.

The engine wires the pieces (model, KV pool, scheduler, runner, committer) and runs the step
loop (``aserve/engine/step_loop.py``) in a task group while it is open. Requests go in
through admission (``admission.py``) and come out through their streams (``stream.py``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from types import TracebackType
from typing import Any

import anyio
import torch
from anyio.streams.memory import MemoryObjectReceiveStream

from aserve.config import EngineConfig
from aserve.device.automata import warm_up as automata_warm_up
from aserve.device.events import POLL_INTERVAL_S, CpuStream, CudaEventWaiter, LoopWaker
from aserve.device.future_map import FutureMap
from aserve.device.runner import ModelRunner
from aserve.device.step import Step
from aserve.engine.admission import Admission, AdmissionLimits, Prompt, check_prompt_list
from aserve.engine.commit import Committer
from aserve.engine.gc_policy import GC_GEN0_THRESHOLD, hold_for_serving, release_after_serving
from aserve.engine.recorder import StepRecorder
from aserve.engine.setup import (
    LoadedEngine,
    available_cpus,
    build_graphs,
    load_engine_parts,
    load_on_stream,
    omp_wait_policy,
)
from aserve.engine.step_loop import StepLoop
from aserve.engine.stream import RequestStream, collect_result, stream_deltas
from aserve.errors import EngineClosedError, EngineFailedError, InvalidRequestError
from aserve.kv.allocator import LedgerView
from aserve.logs import get_logger
from aserve.outputs import CompletionResult, Delta
from aserve.progress import phase
from aserve.sampling.fsm import automata_on
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import MaskFiller
from aserve.sampling_params import SamplingParams, StructuredOutputs
from aserve.scheduler.plan import SchedulerConfig
from aserve.scheduler.policy import Scheduler
from aserve.scheduler.req import Req
from aserve.stats import EngineStats, StepRecord, TraceWriter
from aserve.sync import Signal
from aserve.tokenizer.tokenizer import Tokenizer

log = get_logger("aserve.engine")

__all__ = ["GC_GEN0_THRESHOLD", "Engine", "RequestStream"]


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
        self._exit = AsyncExitStack()
        self._closed = False
        self._started = False  # start() was called: an engine starts once and closes once
        self.requests_finished = 0
        self.requests_aborted = 0
        self.prompt_tokens = 0
        self._gc_frozen = False
        self._t0 = time.perf_counter()  # the trace's time zero

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Load the model and start the step loop. Prefer ``async with``; a task group must be
        entered and left by the same task, so call ``aclose`` from the task that called this.
        If starting fails (the warm-up meets a fault, say), what was started is closed first.
        An engine starts once: starting it again, or after ``aclose``, raises
        :class:`EngineClosedError` (create a new ``Engine``)."""
        if self._closed:
            raise EngineClosedError("this engine is closed; create a new Engine to start again")
        if self._started:
            raise EngineClosedError("this engine was already started; an Engine starts once")
        self._started = True
        try:
            await self._start()
        except BaseException:
            # Not under a shielded scope: the step loop's task group must be left from its own scope.
            await self.aclose()
            raise

    async def _start(self) -> None:
        cfg = self.config
        if cfg.num_threads is not None:
            torch.set_num_threads(cfg.num_threads)
        elif cfg.torch_device.type == "cpu":
            torch.set_num_threads(available_cpus())
        waker = LoopWaker()
        self._cpu_stream: CpuStream | None = None
        self._cuda_waiter: CudaEventWaiter | None = None
        if cfg.torch_device.type == "cpu":
            # All heavy torch work on the CPU backend runs on the stream's worker thread,
            # loading included: a second thread running parallel torch ops keeps its own
            # OpenMP team, and on a small machine the two teams slow each other (measured
            # 45 vs 86 ms per decode step on 2 cores).
            self._cpu_stream = CpuStream(waker)
            self._parts = await load_on_stream(self._cpu_stream, cfg)
        else:
            self._parts = await anyio.to_thread.run_sync(load_engine_parts, cfg)
        parts = self._parts
        # The batch sizes as resolved at load (sized from the device where the user left them unset).
        self.config = cfg = replace(cfg, max_running_requests=parts.sizes.max_running_requests,
                                    max_num_batched_tokens=parts.sizes.max_num_batched_tokens)  # fmt: skip
        if parts.device.type == "cuda" and cfg.cuda_event_wait == "thread":
            self._cuda_waiter = CudaEventWaiter(waker)
        self.scheduler = Scheduler(parts.pool, SchedulerConfig.from_engine(cfg))
        # One mailbox per request row, plus the spare row padded decode-graph rows use.
        self.future_map = FutureMap(parts.pool.rows.num_rows + 1, parts.device, cfg.debug)
        graphs, xgraphs = build_graphs(cfg, parts, self.future_map)
        runner = ModelRunner(parts.model, parts.pool, parts.device, self.future_map, self._cpu_stream,
                             self._cuda_waiter, cfg.resolved_attention_backend, graphs,
                             pipeline_depth=cfg.pipeline_depth, extend_graphs=xgraphs,
                             event_poll_s=0.0 if cfg.cuda_event_wait == "spin" else POLL_INTERVAL_S)  # fmt: skip
        self._runner = runner  # released on close even if the start fails from here on
        if parts.device.type == "cuda":
            for g in (graphs, xgraphs):
                if g is not None:
                    g.capture(runner.forward_stream)
            # A split constrained step's sampler as one replay (ASERVE_SAMPLER_GRAPH=0: launched
            # eagerly, kept to measure one against the other; docs/architecture.md).
            if graphs is not None and os.environ.get("ASERVE_SAMPLER_GRAPH", "1") != "0":
                graphs.capture_masked(runner.forward_stream)
            if runner.automata.on and automata_on(parts.device.type):
                # Its kernels loaded (and the one-launch draw compiled for the graphs' logits)
                # now, not in a constrained step.
                logits = None if graphs is None else graphs.logits_row()
                automata_warm_up(parts.device, logits if runner.automata.one_launch else None)
        self.committer = Committer(self.scheduler, parts.tokenizer, self._on_finish)
        trace = TraceWriter(cfg.trace_path, self._t0) if cfg.trace_path else None
        self._recorder = StepRecorder(trace, runner.device_clock)
        self._loop = StepLoop(self.scheduler, runner, self.committer, self._recorder,
                              pipeline_depth=cfg.pipeline_depth, debug=cfg.debug,
                              watchdog_s=cfg.watchdog_s)  # fmt: skip
        self._admission = Admission(
            AdmissionLimits(
                vocab_size=parts.model_config.vocab_size,
                max_context=parts.pool.max_context,
                kv_tokens=parts.pool.total_tokens,
                eos_token_ids=parts.eos_token_ids,
                max_waiting_requests=cfg.max_waiting_requests,
                stream_interval=cfg.stream_interval,
            ),
            parts.tokenizer,
            cfg.seed,
            Grammars(
                parts.tokenizer,
                parts.model_config.vocab_size,
                filler=MaskFiller.for_device(runner.device.type),
                fsm=automata_on(runner.device.type),
            ),
        )
        await self._exit.enter_async_context(self._loop.running())
        log.info("engine_started", **self._started_fields())
        if cfg.warmup:
            await self._warm_up()
        if cfg.use_gc_freeze:
            hold_for_serving()  # aserve/engine/gc_policy.py
            self._gc_frozen = True

    async def _warm_up(self) -> None:
        # A greedy and a sampled request in one batch: the first use of the sampler's ops
        # (top-k/p, penalties, logprobs) is slow on CUDA (H200: a 0.2 s launch), and would
        # otherwise land on the first user request that samples.
        bos = self.tokenizer.bos_token_id
        prompt = [bos if bos is not None else 0] * 4
        sampled = SamplingParams(max_tokens=2, temperature=0.8, top_k=40, top_p=0.9, min_p=0.01, seed=0,
                                 repetition_penalty=1.1, logprobs=1)  # fmt: skip
        greedy = SamplingParams(max_tokens=2, temperature=0)
        try:
            with phase("warming up"):
                if self.config.max_waiting_requests < 2:  # the second would be refused (429)
                    await self.complete(prompt, greedy)
                    await self.complete(prompt, sampled)
                else:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self.complete, prompt, greedy)
                        tg.start_soon(self.complete, prompt, sampled)
        except BaseExceptionGroup as group:
            # Both requests meet the same fault (the engine failed): report it once, plainly.
            first = group.exceptions[0]
            if isinstance(first, Exception) and all(type(e) is type(first) for e in group.exceptions):
                raise first from None
            raise
        self._recorder.stats.reset()

    async def prepare_structured_outputs(self, *specs: StructuredOutputs) -> None:
        """Build the grammar engine's tokenizer on a worker thread now, not on this engine's
        loop at the first structured request (seconds on a loaded CPU, during which every
        stream stalls and the front ends of ``aserve serve --api-workers`` hear no heartbeat).
        ``aserve serve`` calls it before it says it is ready.

        Where the engine builds token automata (:func:`aserve.sampling.fsm.automata_on`), also
        builds ``specs``' and waits for them (seconds each over a 262k vocabulary; requests
        admitted before one is ready keep llguidance, whose masks are the automaton's)."""
        grammars = self._admission.grammars
        if grammars is not None:
            with phase("preparing structured outputs"):
                await anyio.to_thread.run_sync(grammars.prepare)
                if grammars.fsms is not None:
                    for spec in specs:
                        grammars.build_automaton(spec)
                        await anyio.to_thread.run_sync(grammars.fsms.wait, spec)

    async def aclose(self) -> None:
        """Stop the scheduler; unfinished requests end with ``finish_reason == "abort"``.

        After a fault (``failure``) it closes just the same and raises nothing: the fault
        went to the requests it ended. After a stall it does not wait for the device."""
        if self._closed:
            return
        self._closed = True
        if hasattr(self, "_loop"):
            for req in list(self._loop.live):
                if not req.finished:
                    self.committer.finish(req, "abort")
        await self._exit.aclose()  # the step loop's task group: cancelled and left
        # The loops are gone; steps still queued on the device finish before the stream
        # thread exits below (unless the device stalled: then nothing waits on it for long).
        # Return every request's KV so the ledger closes.
        stalled = self._stalled
        join_s = 1.0 if stalled else 30.0
        if self._cpu_stream is not None:
            self._cpu_stream.close(join_s)
            self._cpu_stream = None
        if self._parts is not None and self._parts.device.type == "cuda" and not stalled:
            torch.cuda.synchronize(self._parts.device)
        if hasattr(self, "scheduler"):
            self.scheduler.release_all()
        if self._cuda_waiter is not None:
            self._cuda_waiter.close(join_s)
        if self._recorder_trace is not None:
            self._recorder_trace.write()
        if self._gc_frozen:
            release_after_serving()
            self._gc_frozen = False
        self._release_device_memory()

    def _release_device_memory(self) -> None:
        """A closed engine gives back what it holds on the device: the KV pool and request
        table, the model's weights, the decode graphs and their memory pool, the FutureMap
        and the pinned staging buffers. The host-side ledger, stats and tokenizer stay
        readable. On CUDA the caching allocator then returns the memory to the driver, so
        the next engine in this process sizes its KV pool from the same free memory."""
        parts = self._parts
        if parts is None:
            return
        runner = getattr(self, "_runner", None)
        if runner is not None:
            # Its streams go to the next engine once their work is done (aclose synchronized
            # the device), never after a stall.
            runner.release(reuse_streams=not self._stalled)
        if hasattr(self, "future_map"):
            self.future_map.release()
        parts.pool.release_device()
        parts.model.to("meta")  # parameters and buffers: storage-less from here on
        if parts.device.type == "cuda":
            gc.collect()  # steps and graphs caught in reference cycles hold device tensors
            # cudaFree waits for the device: after a stall it might never return.
            if not self._stalled:
                torch.cuda.empty_cache()

    @property
    def _recorder_trace(self) -> TraceWriter | None:
        return self._recorder.trace if hasattr(self, "_recorder") else None

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

    @property
    def runner(self) -> ModelRunner:
        return self._runner

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._require().eos_token_ids

    @property
    def _stalled(self) -> bool:
        """The watchdog found a step stalled: close must not wait for the device."""
        return hasattr(self, "_loop") and self._loop.stalled

    @property
    def failure(self) -> EngineFailedError | None:
        """The fault that stopped the engine (a device error, a stalled step), or None."""
        return self._loop.broken if hasattr(self, "_loop") else None

    async def wait_failed(self) -> EngineFailedError:
        """Return once the engine has stopped after a fault, with the error its requests got.
        Hosts (the server) use it to stop serving; cancellation only stops the wait."""
        await self._loop.failed.wait()
        assert self._loop.broken is not None, "the failed event is set only with the error"
        return self._loop.broken

    def abort(self, req: Req) -> None:
        """End a submitted request now (``finish_reason == "abort"``); its KV returns at the next safe point."""
        self._loop.abort(req)

    def info(self) -> dict[str, Any]:
        parts, cfg = self._require(), self.config
        pool = parts.pool
        return {
            "model": str(parts.model_path),
            "architecture": parts.model_config.architecture,
            "device": str(parts.device),
            "dtype": str(parts.dtype).removeprefix("torch."),
            "weights": parts.weights,
            "cpu_threads": torch.get_num_threads() if parts.device.type == "cpu" else None,
            "omp_wait_policy": omp_wait_policy() if parts.device.type == "cpu" else None,
            "kv_tokens": pool.total_tokens,
            "kv_bytes_per_token": pool.bytes_per_token(),
            "page_size": pool.page_size,
            "max_context": pool.max_context,
            "max_running_requests": parts.sizes.max_running_requests,
            "max_num_batched_tokens": parts.sizes.max_num_batched_tokens,
            "batch_sizes": parts.sizes.why,
            "full_context_requests_that_fit": pool.total_tokens // pool.max_context,
            "overlap": cfg.overlap,
            "attention_backend": cfg.resolved_attention_backend,
            "fused_ops": parts.fused_ops,
            "cuda_graph": self.runner.decode_graphs is not None,
            # The largest prefill/mixed step a graph serves (0: those steps run eagerly).
            "cuda_graph_max_tokens": 0 if self.runner.extend_graphs is None else self.runner.extend_graphs.sizes[-1],
            "load_s": round(parts.load_s, 2),
            "tokenizer": parts.tokenizer.source,
            "chat_template": parts.tokenizer.chat_template_source or "none (built-in format for the model family)",
        }

    def _started_fields(self) -> dict[str, Any]:
        info, cfg, pool = self.info(), self.config, self._require().pool
        return {
            **{k: info[k] for k in ("model", "device", "dtype", "weights", "kv_tokens", "max_context", "max_running_requests",
                                    "max_num_batched_tokens", "batch_sizes", "overlap", "fused_ops", "cuda_graph",
                                    "cuda_graph_max_tokens", "load_s")},
            "kv_gib": round(pool.total_tokens * pool.bytes_per_token() / 2**30, 2),
            "full_context_requests": info["full_context_requests_that_fit"],
            "pipeline_depth": cfg.pipeline_depth,
            "attention": info["attention_backend"],
            "gc_freeze": cfg.use_gc_freeze,
        }  # fmt: skip

    async def complete(
        self, prompt: Prompt, params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> CompletionResult:
        """Generate to the end and return the whole result.

        Cancelling the calling task aborts the request and frees its KV at the next commit.
        Raises :class:`InvalidRequestError` (or a subclass) for bad input, before anything runs.
        """
        # Woken once per finished choice, not per token, and token ids only while it runs.
        reqs = self.submit(prompt, params or SamplingParams(), request_id, whole=True)
        return await collect_result(reqs, self.tokenizer, self.abort)

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
        reqs = self.submit(prompt, params or SamplingParams(), request_id)
        # aclosing: when our consumer stops early, close the inner generator now, so its
        # ``finally`` aborts the request at once instead of whenever it is collected.
        async with contextlib.aclosing(stream_deltas(reqs, self.tokenizer, self.abort)) as stream:
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
        reqs = self.submit(prompt, params or SamplingParams(), request_id)
        return RequestStream(reqs, self.tokenizer, self.abort)

    def open_streams(
        self, prompts: Sequence[Prompt], params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> RequestStream:
        """Several prompts as one stream (OpenAI's list ``prompt``): ``params.n`` choices per
        prompt, ``Delta.index`` = prompt index * n + choice (OpenAI's and vLLM's numbering).
        Validates every prompt before submitting any; ``aclose`` aborts them all."""
        reqs = self._submit_many(prompts, params or SamplingParams(), request_id, whole=False)
        return RequestStream(reqs, self.tokenizer, self.abort)

    async def complete_many(
        self, prompts: Sequence[Prompt], params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> CompletionResult:
        """``complete`` for several prompts: one result whose ``outputs`` are numbered as in
        ``open_streams`` and whose usage sums the prompts. Cancelling the caller aborts them."""
        reqs = self._submit_many(prompts, params or SamplingParams(), request_id, whole=True)
        return await collect_result(reqs, self.tokenizer, self.abort)

    def _submit_many(
        self, prompts: Sequence[Prompt], params: SamplingParams, request_id: str | None, *, whole: bool
    ) -> list[Req]:
        self._require()
        check_prompt_list(prompts)
        if len(prompts) == 1:
            return self.submit(prompts[0], params, request_id, whole=whole)
        if not prompts:
            raise InvalidRequestError("no prompts given", param="prompt")
        self._check_open()
        waiting = sum(1 for r in self._loop.live if r.row is None)
        signal = Signal()  # one consumer for all of them
        wake = 0 if whole else self._admission.limits.stream_interval
        groups = [
            self._admission.make_requests(
                p, params, None if request_id is None else f"{request_id}-{k}", waiting=waiting + k * params.n,
                whole=whole, signal=signal, wake_every=wake,
            )
            for k, p in enumerate(prompts)
        ]  # fmt: skip
        for reqs in groups:
            self._enqueue(reqs)
        return [r for reqs in groups for r in reqs]

    def watch_steps(self) -> contextlib.AbstractAsyncContextManager[MemoryObjectReceiveStream[Step]]:
        """``async with engine.watch_steps() as steps: async for step in steps: ...``: every
        step launched while the block runs, each with its four awaitable token states
        (``step.planned``, ``in_flight``, ``materialized``, ``committed``; see
        ``aserve/device/step.py``). The stream ends when the engine closes, and states a step
        never reaches then raise :class:`EngineClosedError` for their waiters."""
        return self._loop.watch_steps()

    def stats(self) -> EngineStats:
        self._require_started()
        return self._recorder.engine_stats(
            self.scheduler, self.ledger(), self._loop.slots, self.committer.output_tokens,
            finished=self.requests_finished, aborted=self.requests_aborted, prompt_tokens=self.prompt_tokens,
        )  # fmt: skip

    def step_records(self) -> list[StepRecord]:
        self._require_started()
        return list(self._recorder.stats.records)

    def reset_stats(self) -> None:
        self._require_started()
        self._recorder.stats.reset()

    def ledger(self) -> LedgerView:
        """KV accounting: ``free + used == total``; ``cached`` pages (the prefix cache) are
        part of ``used``; ``all_free`` means no request holds anything."""
        return self._require().pool.ledger(cached_pages=self.scheduler.prefix.num_cached_pages)

    def flush_cache(self) -> int:
        """Drop the prefix cache; only when nothing runs. Returns the tokens freed, or -1."""
        if self.scheduler.running or self.scheduler.waiting:
            return -1
        return self.scheduler.prefix.flush() * self.scheduler.pool.page_size

    # -- requests ---------------------------------------------------------------

    def _require_started(self) -> None:
        """Stats stay readable after close; before start there are none."""
        if not hasattr(self, "_recorder"):
            raise EngineClosedError("the engine is not started; use `async with Engine(...)`")

    def _require(self) -> LoadedEngine:
        if self._parts is None:
            raise EngineClosedError("the engine is not started; use `async with Engine(...)`")
        return self._parts

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None = None,
        *,
        whole: bool = False,
        seeds: Sequence[int] | None = None,
        signal: Signal | None = None,
    ) -> list[Req]:
        """Admit (validate, or raise a typed error) and hand the requests to the step loop.

        The low-level door under ``complete``/``generate``/``open_stream`` (and the engine
        core's, for requests from front-end processes: ``seeds`` chosen there, ``signal`` shared
        by all of one front end's requests). Returns the ``n`` choices' requests, whose output
        cells fill as steps commit; ``abort(req)`` ends one."""
        self._require()
        self._check_open()
        # Requests submitted but not yet admitted (some still in the ingest channel) count too.
        waiting = sum(1 for r in self._loop.live if r.row is None)
        reqs = self._admission.make_requests(
            prompt, params, request_id, waiting=waiting, whole=whole, seeds=seeds, signal=signal
        )
        self._enqueue(reqs)
        return reqs

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is shutting down; no new requests are accepted")
        if self._loop.broken is not None:
            raise EngineFailedError(f"no new requests are accepted: {self._loop.broken}")

    def _enqueue(self, reqs: list[Req]) -> None:
        trace = self._recorder.trace
        for r in reqs:
            if trace is not None:
                trace.request_state(r.rid, "queued", r.arrival)
        self.prompt_tokens += len(reqs[0].prompt_ids)
        self._loop.submit(reqs)

    def _on_finish(self, req: Req) -> None:
        self._loop.live.discard(req)
        if req.finish_reason == "abort":
            self.requests_aborted += 1
        else:
            self.requests_finished += 1
        ttft = None if req.first_token_time is None else round(req.first_token_time - req.arrival, 6)
        e2e = None if req.finish_time is None else round(req.finish_time - req.arrival, 6)
        trace = self._recorder.trace
        if trace is not None and req.finish_time is not None:
            trace.request_state(req.rid, f"finished:{req.finish_reason}", req.finish_time)
        log.info("request_end", rid=req.rid, prompt_tokens=len(req.prompt_ids), output_tokens=len(req.output_ids),
                 finish_reason=req.finish_reason, ttft_s=ttft, e2e_s=e2e, retractions=req.num_retractions)  # fmt: skip

"""Device work for one step: inputs in, forward + sample, tokens out to the host.

``ModelRunner.launch(plan, prepare(plan))`` turns a plan into a :class:`~aserve.device.step.Step` and returns
*before* the device finishes; the step's ``materialized`` and ``copied`` events are the
device's side of the four token states (``aserve/device/step.py``).

On CPU every device-side closure runs on the worker thread in submission order. On CUDA the
closures run inline on the caller's thread, enqueueing kernels: metadata H2D on the schedule
stream, forward and sampling on the forward stream, D2H on the copy stream.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from aserve.attention.metadata import AttentionMetadata
from aserve.device.automata import AutomatonRows, DevicePath
from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.events import CpuStream, CudaEventWaiter, DeviceEvent, cuda_record
from aserve.device.extend_graphs import ExtendGraphs
from aserve.device.future_map import FutureMap
from aserve.device.inputs import DeviceInputs, StepInputs, build_inputs
from aserve.device.staging import PinnedStaging
from aserve.device.step import Step, StepOutputs
from aserve.device.streams import give_back_runner_streams, on_stream, take_runner_streams
from aserve.kv.pool import KVPool
from aserve.models.causal_lm import CausalLM
from aserve.sampling.masks import FillRunner, GrammarState, fill_masks, mask_words
from aserve.sampling.sampler import (
    SampleOutput,
    apply_masks_,
    candidate_width,
    plain_greedy,
    prompt_logprobs,
    sample,
    sample_candidates,
)
from aserve.scheduler.policy import Plan


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        pool: KVPool,
        device: torch.device,
        future_map: FutureMap,
        cpu_stream: CpuStream | None,
        cuda_waiter: CudaEventWaiter | None,
        attention_backend: str = "torch",
        decode_graphs: DecodeGraphs | None = None,
        pipeline_depth: int = 2,
        extend_graphs: ExtendGraphs | None = None,
        event_poll_s: float = 0.0,
    ) -> None:
        self.event_poll_s = event_poll_s  # between two query()s of an awaited CUDA event (0: every pass)
        self.attention_backend = attention_backend
        self.decode_graphs = decode_graphs
        self.extend_graphs = extend_graphs
        self.model = model
        self.pool = pool
        self.device = device
        self.future_map = future_map
        self.cpu_stream = cpu_stream
        self.cuda_waiter = cuda_waiter
        self._index = 0
        self.fast_graph_steps = 0  # steps whose host inputs took the greedy graph fast path
        self.split_steps = 0  # steps launched in two (constrained rows' masks filled later)
        self.masked_graph_steps = 0  # greedy graph steps with constrained rows (a masked argmax)
        self.fsm_gathers = 0  # masked-argmax steps whose masks a token automaton gathered on the device
        self.automata = DevicePath(device, future_map)  # token automata's states on the device
        self._fsm_row_buf: torch.Tensor | None = None
        self.candidate_steps = 0  # CPU top-k steps sampled from the head's candidates alone
        self.candidate_fallbacks = 0  # ... that found a tie past the candidates (full logits)
        # Per-slot pinned buffers (more slots than the pipeline depth, see PinnedStaging) for
        # inputs and outputs.
        slots = max(3, pipeline_depth + 1)
        self.staging = PinnedStaging(slots, pin=device.type == "cuda")
        self.out_staging = PinnedStaging(slots, pin=device.type == "cuda")
        self._streams: tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream] | None = None
        if device.type == "cuda":
            # A closed engine's streams if there is one (aserve/device/streams.py: each new
            # stream costs a cuBLAS workspace for the life of the process).
            streams = take_runner_streams(device)
            self.schedule_stream, self.forward_stream, self.copy_stream = streams
            self._streams = streams
            # A device event at a known host time: device timings become host-clock times.
            self._clock_base = torch.cuda.Event(enable_timing=True)
            self._clock_base.record(self.forward_stream)
            self._clock_base.synchronize()
            self._clock_host = time.perf_counter()

    def device_clock(self, event: DeviceEvent) -> float:
        """When the device passed ``event``, on the host clock (``time.perf_counter``). On
        CUDA from timing events (the event must have completed), else the stream's own stamp."""
        if event.cuda_event is None:
            return event.host_time
        return self._clock_host + self._clock_base.elapsed_time(event.cuda_event) / 1e3

    def release(self, reuse_streams: bool = True) -> None:
        """The engine closed: drop the CUDA graphs and the staging buffers, and hand the streams
        to the next runner (``reuse_streams``: their work has finished; not after a stall)."""
        if self.decode_graphs is not None:
            self.decode_graphs.release()
        if self.extend_graphs is not None:
            self.extend_graphs.release()
        self.staging.clear()
        self.out_staging.clear()
        streams, self._streams = self._streams, None
        if streams is not None and reuse_streams:
            give_back_runner_streams(streams)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def prepare(self, plan: Plan) -> StepInputs:
        """``plan``'s host inputs (``build_s``: the time that took). They read the requests'
        committed state, so they are built in the same synchronous stretch as the plan: a commit
        in between would change what the plan decided (a penalised decode's pending output)."""
        t0 = time.perf_counter()
        host = build_inputs(plan, self.decode_graphs, self.extend_graphs)
        host.build_s = time.perf_counter() - t0
        return host

    def launch(self, plan: Plan, host: StepInputs, plan_s: float = 0.0, defer_masks: bool = False) -> Step:
        """Launch ``plan``'s step from its inputs (:meth:`prepare`). With ``defer_masks`` and rows
        a grammar constrains, only the forward is launched: their masks need the tokens of the
        steps still in flight, so the sampler waits for ``step.finish_launch()``, which the step
        loop calls once every earlier step is committed (the split launch, docs/architecture.md
        "Structured outputs"); its argument, a :data:`FillRunner`, may run the masks' GIL-free
        part beside other work."""
        t0 = time.perf_counter()
        if host.sampling is None:
            self.fast_graph_steps += 1
        # Rows in token automata whose states the device holds or the host knows: if they are
        # all the step's constrained rows, it is launched whole, never split; else their states
        # are moved on after the draw (aserve.device.automata).
        auto = self.automata.rows(plan, host)
        whole = auto is not None and auto.whole
        defer = defer_masks and bool(host.grammar_states) and not whole
        self.split_steps += defer
        index = self._index
        self._index += 1
        if self.is_cuda:
            step = self._launch_cuda(index, plan, host, defer, auto)
        else:
            step = self._launch_cpu(index, plan, host, defer, auto)
        step.launch_time = t0
        step.grammar_rows = host.grammar_rows
        step.plan_s = plan_s
        step.launch_s = time.perf_counter() - t0 + host.build_s
        step.prepare_s = host.build_s
        return step

    def _step(
        self, index: int, plan: Plan, begin: DeviceEvent, materialized: DeviceEvent, copied: DeviceEvent,
        keepalive: list[Any],
    ) -> Step:  # fmt: skip
        """The step handle; the plan's sequences are the snapshot the committer reads."""
        return Step(
            index=index,
            entries=plan.extra,
            block=plan.block,
            num_tokens=plan.num_tokens,
            num_decodes=plan.num_decodes,
            forward_begin=begin,
            materialized=materialized,
            copied=copied,
            launch_time=0.0,
            keepalive=keepalive,
        )

    @property
    def fsm_device_steps(self) -> int:
        """Steps launched whole, their rows' automaton states on the device."""
        return self.automata.steps

    @property
    def fsm_steady_steps(self) -> int:
        """Of those, a decode block's steps that reused the step before's rows."""
        return self.automata.steady_steps

    # -- device side -------------------------------------------------------------

    def _device_work(self, dev: DeviceInputs) -> SampleOutput:
        """Everything between 'inputs on the device' and 'tokens in the FutureMap'."""
        return self._sample_part(self._forward(dev), dev)

    def _sample_part(self, fwd: SampleOutput | _Logits, dev: DeviceInputs) -> SampleOutput:
        """The sampler after :meth:`_forward` (nothing on the greedy graph fast path; a masked
        argmax when that step has constrained rows)."""
        if isinstance(fwd, SampleOutput):
            return fwd
        if dev.sbatch is None:
            return self._masked_argmax(fwd.logits, dev, fwd.argmax)
        out = self._sample_and_publish(fwd.logits, dev, fwd.gathered)
        if fwd.prompt is not None:
            out.prompt_logprobs, out.prompt_top_ids, out.prompt_top_logprobs = fwd.prompt
        return out

    def _forward(self, dev: DeviceInputs) -> SampleOutput | _Logits:
        """The forward: the logits to sample from, or the tokens themselves on the greedy graph
        fast path (the graph's argmax)."""
        if dev.graph_in is not None:
            return self._graph_decode(dev, dev.graph_in)
        f = dev.fields
        assert f is not None, "a step without a graph input has the general fields"
        table = self.pool.table_device
        # The new tokens' table entries: each sequence's row once a token (``output_size`` is
        # known on the host: no sync), at the tokens' positions; then a cache hit's prefix.
        token_rows = torch.repeat_interleave(dev.rows, f.extend, output_size=f.positions.shape[0])
        table[token_rows, f.positions] = f.slots
        if f.table_rows.shape[0]:
            table[f.table_rows, f.table_cols] = f.table_slots
        input_ids = f.input_ids
        gathered = None
        if f.decode_rows.numel() > 0:
            gathered = self.future_map.gather(f.decode_rows, f.decode_gens)
        if dev.xgraph_in is not None:
            assert self.extend_graphs is not None  # no inference_mode(): see _graph_decode
            logits = self.extend_graphs.run(dev.xgraph_in, f.decode_token_idx, gathered)[: f.logits_idx.shape[0]]
            if dev.sbatch is not None:
                return _Logits(logits, gathered, None)
            # Every row plain greedy (no sampler inputs were built): the argmax is the output.
            tokens = logits.argmax(dim=-1)
            self._publish(dev, tokens)
            return SampleOutput(tokens, None, None, None)
        if gathered is not None:
            input_ids = input_ids.index_put((f.decode_token_idx,), gathered)
        logits_idx = f.logits_idx
        num_prompt_rows = f.plp_idx.shape[0]  # host-known shape: no sync
        if num_prompt_rows:
            logits_idx = torch.cat((f.logits_idx, f.plp_idx))
        meta = AttentionMetadata(
            positions=f.positions,
            out_cache_loc=f.slots,
            req_pool_indices=dev.rows,
            prefix_lens=f.prefix,
            extend_lens=f.extend,
            seq_lens=f.prefix + f.extend,
            req_to_token=table,
            logits_indices=logits_idx,
            prefix_lens_cpu=dev.prefix_cpu,
            extend_lens_cpu=dev.extend_cpu,
            backend=self.attention_backend,
        )
        with torch.inference_mode():
            model = self.model
            if self.device.type == "cpu" and not num_prompt_rows and isinstance(model, CausalLM):
                width = candidate_width(dev.sbatch)
                if width or plain_greedy(dev.sbatch):
                    # The sampler would read the logits for the drawn tokens alone: ask the head.
                    return self._cpu_head(model, input_ids, meta, dev, gathered, width)
            logits = self.model(input_ids, meta, self.pool.kv_cache)  # [B + E, V]
            if not num_prompt_rows:
                return _Logits(logits, gathered, None)
            b = f.logits_idx.shape[0]
            prompt = prompt_logprobs(logits[b:], f.plp_target, dev.plp_top)
        return _Logits(logits[:b], gathered, prompt)

    def _cpu_head(
        self,
        model: CausalLM,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        dev: DeviceInputs,
        gathered: torch.Tensor | None,
        width: int,
    ) -> SampleOutput | _Logits:
        """A CPU step without prompt logprobs whose sampler would read the logits for the drawn
        tokens alone: the head answers without writing the [B, vocab] logits (on the int8 GGUF
        head; ``CausalLM.greedy`` / ``candidates``). Every row greedy (``width`` 0): its argmax.
        Every sampled row with a top-k: ``sample_candidates`` on each row's top ``width``, the
        same tokens as ``sample``; where the head has no such kernel, or a tie may run past the
        candidates, the step's logits go to the sampler."""
        h = model(input_ids, meta, self.pool.kv_cache, head=False)  # [B, hidden]
        if not width:
            tokens: torch.Tensor | None = model.greedy(h)  # [B]
        else:
            assert dev.sbatch is not None
            cand = model.candidates(h, width)
            tokens = sample_candidates(*cand, dev.sbatch) if cand is not None else None
            self.candidate_steps += tokens is not None
            self.candidate_fallbacks += cand is not None and tokens is None
        if tokens is None:
            return _Logits(model.logits(h), gathered, None)
        self._publish(dev, tokens)
        return SampleOutput(tokens, None, None, None)

    def _graph_decode(self, dev: DeviceInputs, graph_in: torch.Tensor) -> SampleOutput | _Logits:
        """An all-decode step from a captured graph (table update, gather, forward, greedy
        publish inside); the sampler runs after it only when some row does not decode greedily."""
        graphs, fm = self.decode_graphs, self.future_map
        assert graphs is not None
        fm.check(dev.rows, dev.gens)  # every row decodes: rows are the decode rows
        # No inference_mode() here: a replay records no autograd state, and the CPU body
        # enters it itself (a profile on the H200 charged ~0.5 ms per step to its __exit__).
        g = graphs.run(graph_in)
        b = dev.rows.shape[0]
        if fm.debug:
            fm.generations[dev.rows] = dev.gens
        if dev.sbatch is None and dev.mask_rows is None:
            # Every row plain greedy (the fast path of ``build_inputs``): the graph's argmax is
            # the output. A copy: the graph's buffer is rewritten by the next replay, maybe
            # before this step's device-to-host copy ran on the copy stream.
            return SampleOutput(g.tokens[:b].clone(), None, None, None)
        # The sampler works in float32; a masked argmax takes the head's dtype as it is.
        if dev.sbatch is None:
            return _Logits(g.logits[:b], g.input_ids[:b], None, g.tokens[:b])
        return _Logits(g.logits[:b].float(), g.input_ids[:b], None)

    def _masked_argmax(self, logits: torch.Tensor, dev: DeviceInputs, argmax: torch.Tensor | None) -> SampleOutput:
        """A greedy step with constrained rows (every row of a decode-only step samples): the
        argmax of each constrained row over its mask, the plain argmax elsewhere (``argmax``,
        the graph's, when given), published over the graph's own tokens.

        With :data:`FUSED_ARGMAX_ROWS` constrained rows or more, on CUDA, one masked-argmax
        kernel launch that neither writes the logits nor reads a disallowed token's logit and
        publishes the constrained rows' tokens itself (``masked_argmax_``; the graph published
        the others). Otherwise the masks are applied in place (the buffer is the graph's,
        rewritten by its next replay) before the argmax."""
        self.masked_graph_steps += 1
        if dev.automata is not None:  # every constrained row in a token automaton: one launch
            # Set on decode-graph steps only (``mask_rows``), which bring the graph's argmax: a
            # copy, as below.
            assert argmax is not None, "a one-launch draw after a decode graph"
            auto, packed = dev.automata
            fm = self.future_map
            tokens = auto.argmax_(argmax.clone(), logits, packed, dev.rows, fm.states, (fm.tokens, dev.rows))
            return SampleOutput(tokens, None, None, None)
        assert dev.mask_rows is not None and dev.mask_bits is not None, "a masked step without its masks"
        if logits.is_cuda and dev.mask_rows.shape[0] >= FUSED_ARGMAX_ROWS:
            from aserve.kernels.bitmask import masked_argmax_

            if argmax is not None:
                # A copy: the graph's tokens are rewritten by its next replay, maybe before this
                # step's copy to the host ran on the copy stream.
                tokens = argmax.clone()
                masked_argmax_(tokens, logits, dev.mask_rows, dev.mask_bits, (self.future_map.tokens, dev.rows))
                return SampleOutput(tokens, None, None, None)
            tokens = masked_argmax_(logits.argmax(dim=-1), logits, dev.mask_rows, dev.mask_bits)
        else:
            # On CUDA the masks are a Triton kernel's raw write, which autograd does not see:
            # no inference_mode() (a profile on the H100 host charged ~0.23 ms a step to its
            # exit). On a CPU they are torch ops on the graph's inference tensor, which need it.
            with contextlib.nullcontext() if logits.is_cuda else torch.inference_mode():
                apply_masks_(logits, dev.mask_rows, dev.mask_bits)
                tokens = logits.argmax(dim=-1)
        self.future_map.publish(dev.rows, tokens, dev.gens)
        return SampleOutput(tokens, None, None, None)

    def _sample_and_publish(
        self, logits: torch.Tensor, dev: DeviceInputs, gathered: torch.Tensor | None
    ) -> SampleOutput:
        f, sbatch = dev.fields, dev.sbatch
        assert f is not None and sbatch is not None, "the sampler runs on general-path steps only"
        with torch.inference_mode():
            if sbatch.output_tokens is not None and gathered is not None and f.pending_b.numel() > 0:
                sbatch.output_tokens[f.pending_b, f.pending_c] = gathered[f.pending_decode]
            out = sample(logits, sbatch)
        self._publish(dev, out.token_ids)
        return out

    def _publish(self, dev: DeviceInputs, tokens: torch.Tensor) -> None:
        """The sampled sequences' tokens ([B]) into the FutureMap, for the next step to gather."""
        assert dev.fields is not None
        idx = dev.fields.sample_idx  # host-built indices: no data-dependent shapes, no sync
        self.future_map.publish(dev.rows[idx], tokens[idx], dev.gens[idx])

    def _launch_cpu(self, index: int, plan: Plan, host: StepInputs, defer: bool, auto: AutomatonRows | None) -> Step:
        stream = self.cpu_stream
        assert stream is not None
        host_masks = not defer and not (auto is not None and auto.whole)
        sbatch = None if host.sampling is None else host.sampling.batch(self.device, masks=host_masks)
        dev = DeviceInputs.from_packed(host.packed, host, sbatch)
        if host.grammar and host_masks:
            dev = dev.with_masks(fill_masks(host.grammar))
        result: dict[str, Any] = {}
        begin = stream.record(f"step{index}.forward_begin")
        if defer:
            stream.submit(lambda: result.__setitem__("fwd", self._forward(dev)))
            forward_end = stream.record(f"step{index}.forward_end")
        materialized = DeviceEvent(f"step{index}.materialized")
        copied = DeviceEvent(f"step{index}.copied")

        def sample_and_copy(work: Callable[[], SampleOutput]) -> None:
            """``work`` (the whole step, or a split step's sampler), then the copy out."""
            stream.submit(lambda: result.__setitem__("out", work()))
            stream.record(materialized.name, into=materialized)

            def copy_out() -> None:
                out: SampleOutput = result["out"]
                result["host"] = _to_host(out)

            stream.submit(copy_out)
            stream.record(copied.name, into=copied)

        step = self._step(index, plan, begin, materialized, copied, [])
        step.prompt_spans = host.plp_spans
        step.read_host = lambda: result["host"]
        packed = None if auto is None else auto.packed
        if defer:
            grammar = host.grammar_states

            def finish(beside: FillRunner | None = None) -> None:
                masked = dev.with_masks(fill_masks(grammar, beside=beside))
                step.split_gap = (forward_end, stream.record(f"step{index}.sampler_begin"))
                sample_and_copy(
                    lambda: self.automata.draw(masked, lambda d: self._sample_part(result.pop("fwd"), d), auto, packed)
                )

            step.finish_launch = finish
        else:
            sample_and_copy(lambda: self.automata.draw(dev, self._device_work, auto, packed))
        return step

    def _launch_cuda(self, index: int, plan: Plan, host: StepInputs, defer: bool, auto: AutomatonRows | None) -> Step:
        # None: a greedy graph step. Deferred, or their automata on the device: the grammar
        # rows are known, their masks are not (yet, or on the host).
        host_masks = not defer and not (auto is not None and auto.whole)
        sbatch_host = None if host.sampling is None else host.sampling.batch("cpu", masks=host_masks)
        uploads = {"packed_i64": host.packed}
        if auto is not None:
            uploads["automata"] = auto.packed
        sampling_tensors = {} if sbatch_host is None else sbatch_host.tensors()
        uploads.update({"s." + k: v for k, v in sampling_tensors.items()})
        with on_stream(self.schedule_stream):
            on_device = self.staging.upload(index, uploads, self.device)
        sbatch = None
        if sbatch_host is not None:
            sbatch = sbatch_host.replace_tensors({k: on_device["s." + k] for k in sampling_tensors})
        dev = DeviceInputs.from_packed(on_device["packed_i64"], host, sbatch)
        mask_keep: list[Any] = [] if auto is None else auto.keep()
        packed = on_device.get("automata")
        if host.grammar and host_masks:
            dev = dev.with_masks(self._upload_masks(index, host.grammar, mask_keep))
        self.forward_stream.wait_stream(self.schedule_stream)
        with on_stream(self.forward_stream):
            begin = self._record(self.forward_stream, f"step{index}.forward_begin")
            fwd = self._forward(dev) if defer else None
            forward_end = self._record(self.forward_stream, f"step{index}.forward_end") if defer else None
        bufs: dict[str, torch.Tensor] = {}
        if fwd is None:
            work = lambda: self.automata.draw(dev, self._device_work, auto, packed)  # noqa: E731
            out, materialized, copied = self._sample_cuda(index, work, bufs, None)
            step = self._step(index, plan, begin, materialized, copied, [dev, out, *mask_keep])
        else:
            # Placeholders, recorded by finish_launch(); a watcher may await them before that.
            step = self._step(index, plan, begin, DeviceEvent(f"step{index}.materialized"),
                              DeviceEvent(f"step{index}.copied"), [dev, fwd, *mask_keep])  # fmt: skip
            grammar = host.grammar_states

            def finish(beside: FillRunner | None = None) -> None:
                # The masks, filled straight into pinned memory, then the sampler and the copy out.
                keep: list[torch.Tensor] = []
                masked = dev.with_masks(self._upload_masks(index, grammar, keep, beside))
                self.forward_stream.wait_stream(self.schedule_stream)
                assert forward_end is not None
                sampler_begin = self._record(self.forward_stream, f"step{index}.sampler_begin")
                step.split_gap = (forward_end, sampler_begin)
                work = lambda: self.automata.draw(masked, lambda d: self._sample_part(fwd, d), auto, packed)  # noqa: E731
                out, _, _ = self._sample_cuda(index, work, bufs, step)
                step.keepalive += [masked, out, *keep]

            if self._takes_masked_graph(dev, grammar):
                step.finish_launch = lambda beside=None: self._finish_masked_graph(
                    index, step, dev, grammar, forward_end, beside, auto, packed
                )
            else:
                step.finish_launch = finish
        step.prompt_spans = host.plp_spans
        step.read_host = lambda: _bufs_to_outputs(bufs)
        return step

    def _takes_masked_graph(self, dev: DeviceInputs, grammar: list[GrammarState]) -> bool:
        """Whether its size's masked-argmax graph samples this split step: a greedy
        decode-graph step (no sampler inputs) whose every row a grammar constrains, enough of
        them for the fused masked argmax (``FUSED_ARGMAX_ROWS``).

        Only then: the graph takes every row of its size, and a free row would need an
        all-ones mask (32 KiB a row filled and copied) where the eager launch takes the
        constrained rows alone."""
        graphs, rows = self.decode_graphs, len(grammar)
        if graphs is None or dev.graph_in is None or dev.sbatch is not None:
            return False
        return (rows == dev.rows.shape[0] and rows >= FUSED_ARGMAX_ROWS
                and graphs.has_masked(dev.graph_in.shape[1], mask_words(grammar[0].vocab_size)))  # fmt: skip

    def _finish_masked_graph(
        self,
        index: int,
        step: Step,
        dev: DeviceInputs,
        grammar: list[GrammarState],
        forward_end: DeviceEvent | None,
        beside: FillRunner | None = None,
        auto: AutomatonRows | None = None,
        packed: torch.Tensor | None = None,
    ) -> None:
        """A split step's sampler from its size's masked-argmax graph: the masks filled into
        the graphs' pinned buffer (row i: the step's row i; the padded rows' stale masks pick
        tokens for the spare row), one replay on the forward stream, and the step's two events
        after it (the graph copies the tokens back itself). The buffers are the graphs', not a
        step's: the step before this one has been committed and read (its outputs are lists on
        the host), and no later step replays a masked graph before this one is committed.
        Sets ``step.read_host`` (the launch's, for the eager sampler's buffers, is not used)."""
        graphs = self.decode_graphs
        assert graphs is not None and dev.graph_in is not None and forward_end is not None
        size, b = dev.graph_in.shape[1], len(grammar)
        buffers = graphs.masked
        assert buffers is not None, "a masked-argmax step without its graphs"
        fsm = _one_automaton(grammar)
        if fsm is not None:
            # Rows of one token automaton (ASERVE_GRAMMAR_FSM): their states' rows of its masks,
            # kept on the device, gathered there; only the row numbers cross (8 bytes a row).
            rows = self._fsm_rows(size)
            rows[:b] = torch.tensor([fsm.row_of(st) for st in grammar], dtype=torch.int64)  # type: ignore[arg-type]
            with on_stream(self.schedule_stream):
                picked = rows[:b].to(self.device, non_blocking=True)
                torch.index_select(fsm.on_device(self.device).masks, 0, picked, out=buffers.device_bits[:b])
            self.fsm_gathers += 1
        else:
            fill_masks(grammar, buffers.host_bits[:b], beside)
            # The masks' copy on the schedule stream: it runs beside whatever of the step's
            # forward the device has still to run, rather than after it.
            with on_stream(self.schedule_stream):
                graphs.upload_masks(size)
        stream = self.forward_stream
        stream.wait_stream(self.schedule_stream)
        with on_stream(stream):
            step.split_gap = (forward_end, self._record(stream, f"step{index}.sampler_begin"))
            graphs.masked_argmax(size)
            if auto is not None and packed is not None:  # its rows in automata: their states moved on
                auto.track(packed, dev.rows, self.future_map.states, buffers.device_tokens[:b])
            self._record(stream, f"step{index}.materialized", into=step.materialized)
            self._record(stream, f"step{index}.copied", self.cuda_waiter, into=step.copied)
        self.masked_graph_steps += 1
        host_tokens = buffers.host_tokens
        step.read_host = lambda: StepOutputs(token_ids=host_tokens[:b].tolist())

    def _fsm_rows(self, size: int) -> torch.Tensor:
        """A pinned int64 buffer of at least ``size`` entries for a masked step's automaton rows.
        One is enough: the next masked step fills it after this one's commit, when its copy has
        long run (the copy precedes the replay whose tokens that commit read)."""
        rows = self._fsm_row_buf
        if rows is None or rows.numel() < size:
            rows = self._fsm_row_buf = torch.empty(size, dtype=torch.int64, pin_memory=True)
        return rows

    def _record(
        self, stream: Any, name: str, waiter: CudaEventWaiter | None = None, *, into: DeviceEvent | None = None
    ) -> DeviceEvent:
        """A timing CUDA event on ``stream``, awaited as ``cuda_event_wait`` says (``event_poll_s``)."""
        return cuda_record(stream, waiter, name, poll_s=self.event_poll_s, into=into)

    def _upload_masks(
        self, index: int, grammar: list[GrammarState], keep: list[torch.Tensor], beside: FillRunner | None = None
    ) -> torch.Tensor:
        """The rows' masks, filled straight into pinned memory and copied on the schedule
        stream (the forward stream waits for it); the pinned buffer goes into ``keep``."""
        words = mask_words(grammar[0].vocab_size)
        pinned = self.staging.buffer(index, torch.int32, len(grammar) * words, "mask").view(-1, words)
        fill_masks(grammar, pinned, beside)
        with on_stream(self.schedule_stream):
            bits = pinned.to(self.device, non_blocking=True)
        keep.append(pinned)
        return bits

    def _sample_cuda(
        self, index: int, work: Callable[[], SampleOutput], bufs: dict[str, torch.Tensor], step: Step | None
    ) -> tuple[SampleOutput, DeviceEvent, DeviceEvent]:
        """``work`` (the whole step, or a split step's sampler) on the forward stream and the
        results' copy to ``bufs`` on the copy stream; the events are recorded into ``step``'s
        placeholders when it is given."""
        with on_stream(self.forward_stream):
            out = work()
            materialized = self._record(self.forward_stream, f"step{index}.materialized",
                                        into=None if step is None else step.materialized)  # fmt: skip
        self.copy_stream.wait_stream(self.forward_stream)
        with on_stream(self.copy_stream):
            for name in _OUTPUTS:
                t = getattr(out, name)
                if t is not None:
                    # One buffer per output: token_ids and top_ids (both int64) shared one
                    # before, and the later copy overwrote the sampled tokens.
                    buf = self.out_staging.buffer(index, t.dtype, t.numel(), name).view(t.shape)
                    buf.copy_(t, non_blocking=True)
                    bufs[name] = buf
            copied = self._record(self.copy_stream, f"step{index}.copied", self.cuda_waiter,
                                  into=None if step is None else step.copied)  # fmt: skip
        return out, materialized, copied


def _one_automaton(grammar: list[GrammarState]) -> Any:
    """The token automaton every row is in (aserve.sampling.fsm), or None."""
    fsm = grammar[0].fsm
    if fsm is None or any(st.fsm is not fsm for st in grammar):
        return None
    return fsm


# Constrained greedy rows from which a step takes the fused masked argmax. Session 20 measured
# its first form (two Triton launches, ~150 us at any size on the H100 host) behind the in-place
# masks below 128 rows; the one-launch form is measured in docs/benchmarks.md (session 21).
FUSED_ARGMAX_ROWS = 1


class _Logits(NamedTuple):
    """A forward's result before sampling: the logits of the sampled rows, the decodes' input
    tokens (penalised requests read them), and the prompt logprobs when asked for."""

    logits: torch.Tensor
    gathered: torch.Tensor | None
    prompt: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    argmax: torch.Tensor | None = None  # a graph's own argmax of ``logits``, when it took one


# What a step hands back to the host (SampleOutput's fields, StepOutputs' names).
_OUTPUTS = ("token_ids", "logprobs", "top_ids", "top_logprobs", "prompt_logprobs", "prompt_top_ids",
            "prompt_top_logprobs")  # fmt: skip


def _to_host(out: SampleOutput) -> StepOutputs:
    tensors: dict[str, torch.Tensor | None] = {name: getattr(out, name) for name in _OUTPUTS}
    return StepOutputs(**{name: t.tolist() for name, t in tensors.items() if t is not None})


def _bufs_to_outputs(bufs: dict[str, torch.Tensor]) -> StepOutputs:
    return StepOutputs(**{name: t.tolist() for name, t in bufs.items()})

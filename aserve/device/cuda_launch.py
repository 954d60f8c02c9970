"""A step's launch on CUDA: its inputs through pinned staging, then its kernels on three streams.

:meth:`CudaLaunch.launch` enqueues and returns; nothing here waits for the device. The inputs
(one packed int64 tensor, the sampler's tensors, a grammar's masks) are copied on the schedule
stream; the forward and the sampler (:class:`~aserve.device.forward.StepForward`) run on the
forward stream, which waits for it; the results' copy to pinned host buffers runs on the copy
stream. Each stage's end is a CUDA event the step carries (``aserve/device/step.py``). A split
step (constrained rows whose masks need the steps in flight) launches its forward here and its
sampler when the step loop calls ``step.finish_launch`` - eagerly, or as one replay of its
size's masked-argmax graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from aserve.device import forward
from aserve.device.automata import AutomatonRows, DevicePath
from aserve.device.events import CudaEventWaiter, DeviceEvent, cuda_record
from aserve.device.forward import StepForward
from aserve.device.inputs import DeviceInputs, StepInputs
from aserve.device.staging import PinnedStaging
from aserve.device.step import OUTPUT_NAMES, Step, StepOutputs
from aserve.device.streams import on_stream
from aserve.sampling.masks import FillRunner, GrammarState, fill_masks, mask_words
from aserve.sampling.sampler import SampleOutput
from aserve.scheduler.plan import Plan


class CudaLaunch:
    """Launches steps on CUDA for a :class:`~aserve.device.runner.ModelRunner`, whose staging
    buffers and streams it uses."""

    def __init__(
        self,
        work: StepForward,
        automata: DevicePath,
        staging: PinnedStaging,
        out_staging: PinnedStaging,
        streams: tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream],
        cuda_waiter: CudaEventWaiter | None,
        event_poll_s: float,
    ) -> None:
        self.work = work
        self.automata = automata
        # The step's device, mailboxes and graphs: the forward's own.
        self.device, self.future_map, self.decode_graphs = work.device, work.future_map, work.decode_graphs
        self.staging = staging
        self.out_staging = out_staging
        self.schedule_stream, self.forward_stream, self.copy_stream = streams
        self.cuda_waiter = cuda_waiter
        self.event_poll_s = event_poll_s  # between two query()s of an awaited CUDA event (0: every pass)
        self.fsm_gathers = 0  # masked-argmax steps whose masks a token automaton gathered on the device
        self._fsm_row_buf: torch.Tensor | None = None

    def launch(self, index: int, plan: Plan, host: StepInputs, defer: bool, auto: AutomatonRows | None) -> Step:
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
            fwd = self.work.forward(dev) if defer else None
            forward_end = self._record(self.forward_stream, f"step{index}.forward_end") if defer else None
        bufs: dict[str, torch.Tensor] = {}
        if fwd is None:
            work = lambda: self.automata.draw(dev, self.work.run, auto, packed)  # noqa: E731
            out, materialized, copied = self._sample_cuda(index, work, bufs, None)
            step = Step.of(index, plan, begin, materialized, copied, [dev, out, *mask_keep])
        else:
            # Placeholders, recorded by finish_launch(); a watcher may await them before that.
            step = Step.of(index, plan, begin, DeviceEvent(f"step{index}.materialized"),
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
                work = lambda: self.automata.draw(masked, lambda d: self.work.sample(fwd, d), auto, packed)  # noqa: E731
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
        return (rows == dev.rows.shape[0] and rows >= forward.FUSED_ARGMAX_ROWS
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
        self.work.masked_graph_steps += 1
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
            for name in OUTPUT_NAMES:
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


def _bufs_to_outputs(bufs: dict[str, torch.Tensor]) -> StepOutputs:
    return StepOutputs(**{name: t.tolist() for name, t in bufs.items()})

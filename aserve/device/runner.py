"""A step's launch: a plan's inputs in, a :class:`~aserve.device.step.Step` out, before the
device has run it.

``ModelRunner.launch(plan, prepare(plan))`` returns *before* the device finishes; the step's
``materialized`` and ``copied`` events are the device's side of the four token states
(``aserve/device/step.py``). What runs on the device is :class:`~aserve.device.forward.StepForward`
(the forward and the sampler). On a CPU every device-side closure runs on the stream's worker
thread in submission order (this module); on CUDA :class:`~aserve.device.cuda_launch.CudaLaunch`
enqueues the kernels from the caller's thread: the inputs' copy on the schedule stream, forward
and sampling on the forward stream, the results' copy on the copy stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from aserve.device.automata import AutomatonRows, DevicePath
from aserve.device.cuda_launch import CudaLaunch
from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.events import CpuStream, CudaEventWaiter, DeviceEvent
from aserve.device.extend_graphs import ExtendGraphs
from aserve.device.forward import StepForward
from aserve.device.future_map import FutureMap
from aserve.device.inputs import DeviceInputs, StepInputs, build_inputs
from aserve.device.staging import PinnedStaging
from aserve.device.step import OUTPUT_NAMES, Step, StepOutputs
from aserve.device.streams import give_back_runner_streams, take_runner_streams
from aserve.kv.pool import KVPool
from aserve.sampling.masks import FillRunner, fill_masks
from aserve.sampling.sampler import SampleOutput
from aserve.scheduler.plan import Plan


class ModelRunner:
    """The device side of the engine: the step inputs' buffers, the streams, the graphs, and the
    launch of each step; its counters say which paths the steps took."""

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
        self.automata = DevicePath(device, future_map)  # token automata's states on the device
        self.work = StepForward(model, pool, device, future_map, attention_backend, decode_graphs, extend_graphs)
        # Per-slot pinned buffers (more slots than the pipeline depth, see PinnedStaging) for
        # inputs and outputs.
        slots = max(3, pipeline_depth + 1)
        self.staging = PinnedStaging(slots, pin=device.type == "cuda")
        self.out_staging = PinnedStaging(slots, pin=device.type == "cuda")
        self._streams: tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream] | None = None
        self._cuda: CudaLaunch | None = None
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
            self._cuda = CudaLaunch(self.work, self.automata, self.staging, self.out_staging, streams, cuda_waiter,
                                    event_poll_s)  # fmt: skip

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
        if self._cuda is not None:
            step = self._cuda.launch(index, plan, host, defer, auto)
        else:
            step = self._launch_cpu(index, plan, host, defer, auto)
        step.launch_time = t0
        step.grammar_rows = host.grammar_rows
        step.plan_s = plan_s
        step.launch_s = time.perf_counter() - t0 + host.build_s
        step.prepare_s = host.build_s
        return step

    @property
    def fsm_device_steps(self) -> int:
        """Steps launched whole, their rows' automaton states on the device."""
        return self.automata.steps

    @property
    def fsm_steady_steps(self) -> int:
        """Of those, a decode block's steps that reused the step before's rows."""
        return self.automata.steady_steps

    @property
    def fsm_gathers(self) -> int:
        """Masked-argmax steps whose masks a token automaton gathered on the device."""
        return 0 if self._cuda is None else self._cuda.fsm_gathers

    @property
    def masked_graph_steps(self) -> int:
        """Greedy graph steps with constrained rows (a masked argmax)."""
        return self.work.masked_graph_steps

    @property
    def candidate_steps(self) -> int:
        """CPU top-k steps sampled from the head's candidates alone."""
        return self.work.candidate_steps

    @property
    def candidate_fallbacks(self) -> int:
        """... that found a tie past the candidates (the full logits)."""
        return self.work.candidate_fallbacks

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
            stream.submit(lambda: result.__setitem__("fwd", self.work.forward(dev)))
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

        step = Step.of(index, plan, begin, materialized, copied, [])
        step.prompt_spans = host.plp_spans
        step.read_host = lambda: result["host"]
        packed = None if auto is None else auto.packed
        if defer:
            grammar = host.grammar_states

            def finish(beside: FillRunner | None = None) -> None:
                masked = dev.with_masks(fill_masks(grammar, beside=beside))
                step.split_gap = (forward_end, stream.record(f"step{index}.sampler_begin"))
                sample_and_copy(
                    lambda: self.automata.draw(masked, lambda d: self.work.sample(result.pop("fwd"), d), auto, packed)
                )

            step.finish_launch = finish
        else:
            sample_and_copy(lambda: self.automata.draw(dev, self.work.run, auto, packed))
        return step


def _to_host(out: SampleOutput) -> StepOutputs:
    tensors: dict[str, torch.Tensor | None] = {name: getattr(out, name) for name in OUTPUT_NAMES}
    return StepOutputs(**{name: t.tolist() for name, t in tensors.items() if t is not None})

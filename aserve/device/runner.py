"""Device work for one step: inputs in, forward + sample, tokens out to the host.

``ModelRunner.launch(plan)`` turns a plan into a :class:`~aserve.device.step.Step` and returns
*before* the device finishes; the step's ``materialized`` and ``copied`` events are the
device's side of the four token states (``aserve/device/step.py``).

On CPU every device-side closure runs on the worker thread in submission order. On CUDA the
closures run inline on the caller's thread, enqueueing kernels: metadata H2D on the schedule
stream, forward and sampling on the forward stream, D2H on the copy stream.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from aserve.attention.metadata import AttentionMetadata
from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.events import CpuStream, CudaEventWaiter, DeviceEvent, cuda_record
from aserve.device.future_map import FutureMap
from aserve.device.inputs import DeviceInputs, StepInputs, build_inputs
from aserve.device.staging import PinnedStaging
from aserve.device.step import Step, StepOutputs
from aserve.kv.pool import KVPool
from aserve.sampling.sampler import SampleOutput, prompt_logprobs, sample
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
    ) -> None:
        self.attention_backend = attention_backend
        self.decode_graphs = decode_graphs
        self.model = model
        self.pool = pool
        self.device = device
        self.future_map = future_map
        self.cpu_stream = cpu_stream
        self.cuda_waiter = cuda_waiter
        self._index = 0
        self.fast_graph_steps = 0  # steps whose host inputs took the greedy graph fast path
        # Per-slot pinned buffers (more slots than the pipeline depth, see PinnedStaging) for
        # inputs and outputs.
        slots = max(3, pipeline_depth + 1)
        self.staging = PinnedStaging(slots, pin=device.type == "cuda")
        self.out_staging = PinnedStaging(slots, pin=device.type == "cuda")
        if device.type == "cuda":
            self.schedule_stream = torch.cuda.Stream(device)
            self.forward_stream = torch.cuda.Stream(device)
            self.copy_stream = torch.cuda.Stream(device)
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

    def release(self) -> None:
        """The engine closed: drop the decode graphs and the staging buffers."""
        if self.decode_graphs is not None:
            self.decode_graphs.release()
        self.staging.clear()
        self.out_staging.clear()

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def launch(self, plan: Plan, plan_s: float = 0.0) -> Step:
        t0 = time.perf_counter()
        host = build_inputs(plan, self.decode_graphs)
        if host.sampling is None:
            self.fast_graph_steps += 1
        index = self._index
        self._index += 1
        if self.is_cuda:
            step = self._launch_cuda(index, plan, host)
        else:
            step = self._launch_cpu(index, plan, host)
        step.launch_time = t0
        step.plan_s = plan_s
        step.launch_s = time.perf_counter() - t0
        return step

    def _step(
        self, index: int, plan: Plan, begin: DeviceEvent, materialized: DeviceEvent, copied: DeviceEvent,
        keepalive: list[Any],
    ) -> Step:  # fmt: skip
        """The step handle; the plan's sequences are the snapshot the committer reads."""
        return Step(
            index=index,
            entries=plan.seqs,
            num_tokens=plan.num_tokens,
            num_decodes=plan.num_decodes,
            forward_begin=begin,
            materialized=materialized,
            copied=copied,
            launch_time=0.0,
            keepalive=keepalive,
        )

    # -- device side -------------------------------------------------------------

    def _device_work(self, dev: DeviceInputs) -> SampleOutput:
        """Everything between 'inputs on the device' and 'tokens in the FutureMap'."""
        if dev.graph_in is not None:
            return self._graph_decode(dev, dev.graph_in)
        f = dev.fields
        assert f is not None, "a step without a graph input has the general fields"
        table = self.pool.table_device
        table[f.table_rows, f.table_cols] = f.table_slots
        input_ids = f.input_ids
        gathered = None
        if f.decode_rows.numel() > 0:
            gathered = self.future_map.gather(f.decode_rows, f.decode_gens)
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
            logits = self.model(input_ids, meta, self.pool.kv_cache)  # [B + E, V]
            if not num_prompt_rows:
                return self._sample_and_publish(logits, dev, gathered)
            b = f.logits_idx.shape[0]
            prompt = prompt_logprobs(logits[b:], f.plp_target, dev.plp_top)
            out = self._sample_and_publish(logits[:b], dev, gathered)
        out.prompt_logprobs, out.prompt_top_ids, out.prompt_top_logprobs = prompt
        return out

    def _graph_decode(self, dev: DeviceInputs, graph_in: torch.Tensor) -> SampleOutput:
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
        if dev.sbatch is None:
            # Every row plain greedy (the fast path of ``build_inputs``): the graph's argmax is
            # the output. A copy: the graph's buffer is rewritten by the next replay, maybe
            # before this step's device-to-host copy ran on the copy stream.
            return SampleOutput(g.tokens[:b].clone(), None, None, None)
        return self._sample_and_publish(g.logits[:b], dev, g.input_ids[:b])

    def _sample_and_publish(
        self, logits: torch.Tensor, dev: DeviceInputs, gathered: torch.Tensor | None
    ) -> SampleOutput:
        f, sbatch = dev.fields, dev.sbatch
        assert f is not None and sbatch is not None, "the sampler runs on general-path steps only"
        with torch.inference_mode():
            if sbatch.output_tokens is not None and gathered is not None and f.pending_b.numel() > 0:
                sbatch.output_tokens[f.pending_b, f.pending_c] = gathered[f.pending_decode]
            out = sample(logits, sbatch)
        idx = f.sample_idx  # host-built indices: no data-dependent shapes, no sync
        self.future_map.publish(dev.rows[idx], out.token_ids[idx], dev.gens[idx])
        return out

    def _launch_cpu(self, index: int, plan: Plan, host: StepInputs) -> Step:
        stream = self.cpu_stream
        assert stream is not None
        sbatch = None if host.sampling is None else host.sampling.batch(self.device)
        dev = DeviceInputs.from_packed(host.packed, host, sbatch)
        result: dict[str, Any] = {}
        begin = stream.record(f"step{index}.forward_begin")
        stream.submit(lambda: result.__setitem__("out", self._device_work(dev)))
        materialized = stream.record(f"step{index}.materialized")

        def copy_out() -> None:
            out: SampleOutput = result["out"]
            result["host"] = _to_host(out)

        stream.submit(copy_out)
        copied = stream.record(f"step{index}.copied")
        step = self._step(index, plan, begin, materialized, copied, [])
        step.prompt_spans = host.plp_spans
        step.read_host = lambda: result["host"]
        return step

    def _launch_cuda(self, index: int, plan: Plan, host: StepInputs) -> Step:
        sbatch_host = None if host.sampling is None else host.sampling.batch("cpu")  # None: a greedy graph step
        uploads = {"packed_i64": host.packed}
        sampling_tensors = {} if sbatch_host is None else sbatch_host.tensors()
        uploads.update({"s." + k: v for k, v in sampling_tensors.items()})
        with torch.cuda.stream(self.schedule_stream):
            on_device = self.staging.upload(index, uploads, self.device)
        sbatch = None
        if sbatch_host is not None:
            sbatch = sbatch_host.replace_tensors({k: on_device["s." + k] for k in sampling_tensors})
        dev = DeviceInputs.from_packed(on_device["packed_i64"], host, sbatch)
        self.forward_stream.wait_stream(self.schedule_stream)
        with torch.cuda.stream(self.forward_stream):
            begin = cuda_record(self.forward_stream, None, f"step{index}.forward_begin")
            out = self._device_work(dev)
            materialized = cuda_record(self.forward_stream, None, f"step{index}.materialized")
        self.copy_stream.wait_stream(self.forward_stream)
        bufs: dict[str, torch.Tensor] = {}
        with torch.cuda.stream(self.copy_stream):
            for name in _OUTPUTS:
                t = getattr(out, name)
                if t is not None:
                    # One buffer per output: token_ids and top_ids (both int64) shared one
                    # before, and the later copy overwrote the sampled tokens.
                    buf = self.out_staging.buffer(index, t.dtype, t.numel(), name).view(t.shape)
                    buf.copy_(t, non_blocking=True)
                    bufs[name] = buf
            copied = cuda_record(self.copy_stream, self.cuda_waiter, f"step{index}.copied")
        step = self._step(index, plan, begin, materialized, copied, [dev, out])
        step.prompt_spans = host.plp_spans
        step.read_host = lambda: _bufs_to_outputs(bufs)
        return step


# What a step hands back to the host (SampleOutput's fields, StepOutputs' names).
_OUTPUTS = ("token_ids", "logprobs", "top_ids", "top_logprobs", "prompt_logprobs", "prompt_top_ids",
            "prompt_top_logprobs")  # fmt: skip


def _to_host(out: SampleOutput) -> StepOutputs:
    tensors: dict[str, torch.Tensor | None] = {name: getattr(out, name) for name in _OUTPUTS}
    return StepOutputs(**{name: t.tolist() for name, t in tensors.items() if t is not None})


def _bufs_to_outputs(bufs: dict[str, torch.Tensor]) -> StepOutputs:
    return StepOutputs(**{name: t.tolist() for name, t in bufs.items()})

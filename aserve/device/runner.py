"""Device work for one step: inputs in, forward + sample, tokens out to the host.

``ModelRunner.launch(plan)`` turns a plan into a ``Step`` and returns *before* the device
finishes. The step carries awaitable events for the token states the design names:

* ``materialized``: sampled tokens are in the FutureMap; the next step may consume them.
* ``copied``: the device-to-host copy landed; the committer may read ``step.outputs``.

On CPU every device-side closure runs on the worker thread in submission order. On CUDA the
closures run inline on the caller's thread, enqueueing kernels: metadata H2D on the schedule
stream, forward and sampling on the forward stream, D2H on the copy stream.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from aserve.attention.metadata import AttentionMetadata
from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.events import CpuStream, CudaEventWaiter, DeviceEvent, cuda_record
from aserve.device.future_map import FutureMap
from aserve.device.staging import PinnedStaging
from aserve.kv.pool import KVPool
from aserve.sampling.sampler import (
    SampleOutput,
    SamplingBatch,
    has_penalty,
    is_plain_greedy,
    make_sampling_batch,
    sample,
)
from aserve.scheduler.policy import Plan
from aserve.scheduler.req import Req

_NO_OUTPUTS: list[int] = []  # stands for the output of a request without penalties (never read)
_NO_BAN: frozenset[int] = frozenset()


class StepEntry(NamedTuple):
    """What the committer needs of one sequence, as it was at launch (the snapshot).

    A NamedTuple: a step builds one per sequence on the launch path, and a frozen
    dataclass costs three times as much to construct."""

    req: Req
    generation: int
    samples: bool
    num_new_tokens: int
    is_decode: bool
    kv_end: int  # positions [0, kv_end) hold KV once this step is committed


@dataclass
class StepOutputs:
    token_ids: list[int]
    logprobs: list[float] | None = None
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


@dataclass
class Step:
    index: int
    entries: tuple[StepEntry, ...]
    num_tokens: int
    num_decodes: int
    forward_begin: DeviceEvent
    materialized: DeviceEvent
    copied: DeviceEvent
    launch_time: float  # host clock when launch began
    plan_s: float = 0.0
    launch_s: float = 0.0
    outputs: StepOutputs | None = None
    depth_in_use: int = 0  # pipeline slots held when it was launched
    after_idle: bool = True  # the device had nothing queued before it (no idle gap to report)
    debug_pages: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))  # (read, written), debug
    # Device tensors and host buffers that must outlive the device's use of them.
    keepalive: list[Any] = field(default_factory=list)
    _read_outputs: Callable[[], StepOutputs] | None = None

    def read_outputs(self) -> StepOutputs:
        """Host copies of the sampled tokens; valid only once ``copied`` completed."""
        assert self.copied.done(), f"step {self.index} read before its copy event"
        if self.outputs is None:
            assert self._read_outputs is not None
            self.outputs = self._read_outputs()
        return self.outputs


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

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def launch(self, plan: Plan, plan_s: float = 0.0) -> Step:
        t0 = time.perf_counter()
        host = self._build_host_inputs(plan)
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

    # -- host side -------------------------------------------------------------

    def _build_host_inputs(self, plan: Plan) -> dict[str, Any]:
        fast = self._graph_fast_inputs(plan)
        if fast is not None:
            return fast
        rows: list[int] = []
        gens: list[int] = []
        prefix: list[int] = []
        extend: list[int] = []
        slots: list[int] = []
        table_rows: list[int] = []
        table_cols: list[int] = []
        table_slots: list[int] = []
        input_ids: list[int] = []
        decode_token_idx: list[int] = []
        decode_rows: list[int] = []
        decode_gens: list[int] = []
        sample_mask: list[bool] = []
        positions: list[int] = []
        # (batch row, column in output_tokens, index among decodes): filled on the device
        pending: list[tuple[int, int, int]] = []
        params, seeds, steps, prompts, outputs = [], [], [], [], []
        banned: list[frozenset[int]] = []
        for i, s in enumerate(plan.seqs):
            rows.append(s.row)
            gens.append(s.generation)
            prefix.append(s.prefix_len)
            extend.append(s.extend_len)
            slots.extend(s.slots)
            # Cached prefix slots (first step after a cache hit) and the new tokens' slots.
            table_rows.extend([s.row] * (len(s.prefix_slots) + s.extend_len))
            table_cols.extend(range(len(s.prefix_slots)))
            new_positions = range(s.prefix_len, s.prefix_len + s.extend_len)
            table_cols.extend(new_positions)
            positions.extend(new_positions)
            table_slots.extend(s.prefix_slots)
            table_slots.extend(s.slots)
            if s.input_ids is None:
                decode_token_idx.append(len(input_ids))
                decode_rows.append(s.row)
                decode_gens.append(s.generation)
                input_ids.append(0)
            else:
                input_ids.extend(s.input_ids)
            sample_mask.append(s.samples)
            req = s.req
            params.append(req.params)
            seeds.append(req.seed)
            steps.append(s.output_index)
            prompts.append(req.prompt_ids)
            # Under min_tokens, this step's token may not be a stop id (EOS included).
            banned.append(req.stop_ids if s.output_index < req.params.min_tokens else _NO_BAN)
            if has_penalty(req.params):
                # Only penalties read the output so far: copying it for every request on
                # every step would cost O(tokens generated) per step.
                out = list(req.output_ids)
                if s.pending_output:
                    pending.append((i, len(out), len(decode_rows) - 1))
                    out.append(0)  # placeholder, replaced by the FutureMap value on the device
                outputs.append(out)
            else:
                outputs.append(_NO_OUTPUTS)
        graph_in: list[int] | None = None
        graphs = self.decode_graphs
        if graphs is not None and len(decode_rows) == len(rows):
            # Every sequence decodes (its input comes from the FutureMap): a captured graph's
            # step, if the batch fits the ladder. [3 * Bp], row-major [3, Bp].
            graph_in = graphs.host_inputs(rows, prefix, slots)
        logits_idx: list[int] = []
        acc = 0
        for e in extend:
            acc += e
            logits_idx.append(acc - 1)
        fields: dict[str, list[int]] = {
            "rows": rows,
            "gens": gens,
            "prefix": prefix,
            "extend": extend,
            "slots": slots,
            "table_rows": table_rows,
            "table_cols": table_cols,
            "table_slots": table_slots,
            "input_ids": input_ids,
            "positions": positions,
            "logits_idx": logits_idx,
            "decode_token_idx": decode_token_idx,
            "decode_rows": decode_rows,
            "decode_gens": decode_gens,
            "sample_idx": [i for i, m in enumerate(sample_mask) if m],
            "pending_b": [b for b, _, _ in pending],
            "pending_c": [c for _, c, _ in pending],
            "pending_decode": [d for _, _, d in pending],
        }
        if graph_in is not None:
            fields["graph_in"] = graph_in
        packed, spans = pack_int64(fields)
        return {
            "packed_i64": packed,
            "spans": spans,
            "prefix_cpu": prefix,
            "extend_cpu": extend,
            "sampling": (params, seeds, steps, prompts, outputs, banned),
        }

    def _graph_fast_inputs(self, plan: Plan) -> dict[str, Any] | None:
        """The common steady-state step: every sequence decodes greedily (no penalty, no
        logprobs) and the batch fits a captured graph. Only the graph's input, rows and
        generations are built and uploaded, and no sampling tensors at all: the graph's
        argmax is the step's output. None when the step needs the general path."""
        graphs = self.decode_graphs
        if graphs is None:
            return None
        for s in plan.seqs:
            if s.input_ids is not None or s.prefix_slots or not is_plain_greedy(s.req.params):
                return None
            if s.output_index < s.req.params.min_tokens:
                return None  # stop ids are banned this step: the sampler must run
        rows = [s.row for s in plan.seqs]
        positions = [s.prefix_len for s in plan.seqs]
        graph_in = graphs.host_inputs(rows, positions, [s.slots[0] for s in plan.seqs])
        if graph_in is None:
            return None
        self.fast_graph_steps += 1
        packed, spans = pack_int64({"graph_in": graph_in, "rows": rows, "gens": [s.generation for s in plan.seqs]})
        return {
            "packed_i64": packed,
            "spans": spans,
            "prefix_cpu": positions,
            "extend_cpu": [1] * len(rows),
            "sampling": None,
        }

    def _step(
        self, index: int, plan: Plan, begin: DeviceEvent, materialized: DeviceEvent, copied: DeviceEvent,
        keepalive: list[Any],
    ) -> Step:  # fmt: skip
        """The step handle; ``entries`` is the snapshot the committer reads (launch order)."""
        entries = tuple(
            StepEntry(s.req, s.generation, s.samples, s.extend_len, s.input_ids is None, s.prefix_len + s.extend_len)
            for s in plan.seqs
        )
        return Step(
            index=index,
            entries=entries,
            num_tokens=plan.num_tokens,
            num_decodes=plan.num_decodes,
            forward_begin=begin,
            materialized=materialized,
            copied=copied,
            launch_time=0.0,
            keepalive=keepalive,
        )

    # -- device side -------------------------------------------------------------

    def _device_work(self, dev: dict[str, Any]) -> SampleOutput:
        """Everything between 'inputs on the device' and 'tokens in the FutureMap'."""
        if "graph_in" in dev:
            return self._graph_decode(dev)
        table = self.pool.table_device
        table[dev["table_rows"], dev["table_cols"]] = dev["table_slots"]
        input_ids = dev["input_ids"]
        gathered = None
        if dev["decode_rows"].numel() > 0:
            gathered = self.future_map.gather(dev["decode_rows"], dev["decode_gens"])
            input_ids = input_ids.index_put((dev["decode_token_idx"],), gathered)
        meta = AttentionMetadata(
            positions=dev["positions"],
            out_cache_loc=dev["slots"],
            req_pool_indices=dev["rows"],
            prefix_lens=dev["prefix"],
            extend_lens=dev["extend"],
            seq_lens=dev["prefix"] + dev["extend"],
            req_to_token=table,
            logits_indices=dev["logits_idx"],
            prefix_lens_cpu=dev["prefix_cpu"],
            extend_lens_cpu=dev["extend_cpu"],
            backend=self.attention_backend,
        )
        with torch.inference_mode():
            logits = self.model(input_ids, meta, self.pool.kv_cache)  # [B, V]
        return self._sample_and_publish(logits, dev, gathered)

    def _graph_decode(self, dev: dict[str, Any]) -> SampleOutput:
        """An all-decode step from a captured graph (table update, gather, forward, greedy
        publish inside); the sampler runs after it only when some row does not decode greedily."""
        graphs, fm = self.decode_graphs, self.future_map
        assert graphs is not None
        fm.check(dev["rows"], dev["gens"])  # every row decodes: rows are the decode rows
        # No inference_mode() here: a replay records no autograd state, and the CPU body
        # enters it itself (a profile on the H200 charged ~0.5 ms per step to its __exit__).
        g = graphs.run(dev["graph_in"])
        b = dev["rows"].shape[0]
        if fm.debug:
            fm.generations[dev["rows"]] = dev["gens"]
        if dev["sbatch"] is None:
            # Every row plain greedy (``_graph_fast_inputs``): the graph's argmax is the output.
            # A copy: the graph's buffer is rewritten by the next replay, maybe before
            # this step's device-to-host copy ran on the copy stream.
            return SampleOutput(g.tokens[:b].clone(), None, None, None)
        return self._sample_and_publish(g.logits[:b], dev, g.input_ids[:b])

    def _sample_and_publish(
        self, logits: torch.Tensor, dev: dict[str, Any], gathered: torch.Tensor | None
    ) -> SampleOutput:
        with torch.inference_mode():
            sbatch = dev["sbatch"]
            if sbatch.output_tokens is not None and gathered is not None and dev["pending_b"].numel() > 0:
                sbatch.output_tokens[dev["pending_b"], dev["pending_c"]] = gathered[dev["pending_decode"]]
            out = sample(logits, sbatch)
        idx = dev["sample_idx"]  # host-built indices: no data-dependent shapes, no sync
        self.future_map.publish(dev["rows"][idx], out.token_ids[idx], dev["gens"][idx])
        return out

    def _launch_cpu(self, index: int, plan: Plan, host: dict[str, Any]) -> Step:
        stream = self.cpu_stream
        assert stream is not None
        host |= unpack_int64(host["packed_i64"], host["spans"])
        host["sbatch"] = _sampling_batch(host["sampling"], self.device)
        result: dict[str, Any] = {}
        begin = stream.record(f"step{index}.forward_begin")
        stream.submit(lambda: result.__setitem__("out", self._device_work(host)))
        materialized = stream.record(f"step{index}.materialized")

        def copy_out() -> None:
            out: SampleOutput = result["out"]
            result["host"] = _to_host(out)

        stream.submit(copy_out)
        copied = stream.record(f"step{index}.copied")
        step = self._step(index, plan, begin, materialized, copied, [])
        step._read_outputs = lambda: result["host"]
        return step

    def _launch_cuda(self, index: int, plan: Plan, host: dict[str, Any]) -> Step:
        sbatch_host = _sampling_batch(host["sampling"], "cpu")  # None: a greedy graph step
        uploads = {"packed_i64": host["packed_i64"]}
        sampling_fields = {
            f.name: getattr(sbatch_host, f.name)
            for f in (dataclasses.fields(sbatch_host) if sbatch_host is not None else ())
            if isinstance(getattr(sbatch_host, f.name), torch.Tensor)
        }
        uploads.update({"s." + k: v for k, v in sampling_fields.items()})
        with torch.cuda.stream(self.schedule_stream):
            dev: dict[str, Any] = dict(self.staging.upload(index, uploads, self.device))
        dev |= unpack_int64(dev["packed_i64"], host["spans"])
        replaced: dict[str, Any] = {k: dev["s." + k] for k in sampling_fields}
        dev["sbatch"] = None if sbatch_host is None else dataclasses.replace(sbatch_host, **replaced)
        dev["prefix_cpu"], dev["extend_cpu"] = host["prefix_cpu"], host["extend_cpu"]
        self.forward_stream.wait_stream(self.schedule_stream)
        with torch.cuda.stream(self.forward_stream):
            begin = cuda_record(self.forward_stream, None, f"step{index}.forward_begin", watch=False)
            out = self._device_work(dev)
            materialized = cuda_record(self.forward_stream, None, f"step{index}.materialized", watch=False)
        self.copy_stream.wait_stream(self.forward_stream)
        bufs: dict[str, torch.Tensor] = {}
        with torch.cuda.stream(self.copy_stream):
            for name in ("token_ids", "logprobs", "top_ids", "top_logprobs"):
                t = getattr(out, name)
                if t is not None:
                    buf = self.out_staging.buffer(index, t.dtype, t.numel()).view(t.shape)
                    buf.copy_(t, non_blocking=True)
                    bufs[name] = buf
            copied = cuda_record(self.copy_stream, self.cuda_waiter, f"step{index}.copied")
        step = self._step(index, plan, begin, materialized, copied, [dev, out])
        step._read_outputs = lambda: _bufs_to_outputs(bufs)
        return step


def _sampling_batch(sampling: tuple[Any, ...] | None, device: torch.device | str) -> SamplingBatch | None:
    if sampling is None:
        return None
    params, seeds, steps, prompts, outputs, banned = sampling
    return make_sampling_batch(params, seeds, steps, prompts, outputs, device, banned)


def pack_int64(fields: dict[str, list[int]]) -> tuple[torch.Tensor, dict[str, tuple[int, int]]]:
    """Every int64 input of a step in one host tensor (one ``torch.tensor`` call, one H2D
    copy); ``unpack_int64`` turns it back into views by name.

    Each field starts on a 16-byte boundary (odd-length fields get one int64 of padding).
    Triton specialises a kernel on whether each pointer argument is 16-byte aligned, so
    without this a field's alignment would follow the parity of the batch size, and the
    first prefill of the other parity compiled new attention kernels in the middle of
    serving (H200: a 1.3 s launch; warm-up had covered only one parity)."""
    flat: list[int] = []
    spans: dict[str, tuple[int, int]] = {}
    for name, values in fields.items():
        spans[name] = (len(flat), len(values))
        flat.extend(values)
        if len(values) % 2:
            flat.append(0)
    return torch.tensor(flat, dtype=torch.int64), spans


def unpack_int64(flat: torch.Tensor, spans: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Views of the packed int64 inputs by name (``graph_in`` as its [3, Bp] matrix)."""
    out = {name: flat[off : off + n] for name, (off, n) in spans.items()}
    if "graph_in" in out:
        out["graph_in"] = out["graph_in"].view(3, -1)
    return out


def _to_host(out: SampleOutput) -> StepOutputs:
    return StepOutputs(
        token_ids=out.token_ids.tolist(),
        logprobs=None if out.logprobs is None else out.logprobs.tolist(),
        top_ids=None if out.top_ids is None else out.top_ids.tolist(),
        top_logprobs=None if out.top_logprobs is None else out.top_logprobs.tolist(),
    )


def _bufs_to_outputs(bufs: dict[str, torch.Tensor]) -> StepOutputs:
    return StepOutputs(
        token_ids=bufs["token_ids"].tolist(),
        logprobs=bufs["logprobs"].tolist() if "logprobs" in bufs else None,
        top_ids=bufs["top_ids"].tolist() if "top_ids" in bufs else None,
        top_logprobs=bufs["top_logprobs"].tolist() if "top_logprobs" in bufs else None,
    )

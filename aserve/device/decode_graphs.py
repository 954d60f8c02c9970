"""Decode steps replayed from CUDA graphs, one graph per padded batch size.

A decode-only step has a fixed shape once the batch is padded to the next size of a ladder
(1, 2, 4, ..., max). Everything between "inputs on the device" and "tokens in the FutureMap"
is captured, so a greedy decode step is one H2D copy, one device copy into the graph's
input buffer, one replay and one D2H copy:

1. the request-to-token table gets each sequence's new slot;
2. the input tokens are gathered from the FutureMap (the previous step's samples);
3. the model forward (Triton decode attention, whose grid depends only on the padded size);
4. greedy tokens (the argmax of the logits in the head's dtype; on CUDA the split-row kernel
   of :func:`aserve.kernels.bitmask.argmax_`) are published back into the FutureMap.

Padded rows use the pool's spare table row and the FutureMap's spare row, position -1
(``seq_len`` 0: they read no key) and the pad slot (their K/V writes land there). A step
that samples (temperature, penalties, logprobs) runs the sampler eagerly on the graph's
logits afterwards and publishes its tokens over the greedy ones, on the same stream.

On a CPU there is nothing to capture: the same body runs directly on the static buffers,
which is how the padding, bucketing and in-graph gather/publish are tested in CI.

On CUDA each size also has a second, small graph for a greedy step whose rows a grammar all
constrains (:meth:`DecodeGraphs.masked_argmax`, issue 16): the masks' copy from one pinned
buffer, the masked argmax over the graph's logits (publishing into the FutureMap) and the
tokens' copy back to pinned memory. A split step's sampler is then one replay where it was
three copies, two waits, a Triton launch and their events (docs/architecture.md,
"Structured outputs").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import torch

from aserve.attention.metadata import AttentionMetadata
from aserve.device.future_map import FutureMap
from aserve.kv.pool import KVPool
from aserve.progress import phase

S = TypeVar("S")
R = TypeVar("R")


@dataclass
class GraphOutputs:
    logits: torch.Tensor  # [Bp, V] in the head's dtype (CausalLM.logits(head_dtype=True)): .float() to sample
    tokens: torch.Tensor  # [Bp] int64, greedy (argmax; on CUDA a NaN logit never wins), already in the FutureMap
    input_ids: torch.Tensor  # [Bp] int64, what was gathered from the FutureMap


@dataclass
class _Static:
    size: int
    inputs: torch.Tensor  # [3, Bp] int64: table rows, positions (-1 = padding), KV slots
    out: GraphOutputs | None = None
    graph: Any = None  # torch.cuda.CUDAGraph on CUDA


class _MaskedBuffers(NamedTuple):
    """The masked-argmax graphs' static buffers, shared by every size (the first rows used)."""

    host_bits: torch.Tensor  # [max, words] int32, pinned: the step's masks, filled in place
    device_bits: torch.Tensor  # [max, words] int32: their copy on the device
    device_tokens: torch.Tensor  # [max] int64: the masked argmax
    host_tokens: torch.Tensor  # [max] int64, pinned: its copy back
    rows: torch.Tensor  # [max] int64: 0, 1, ... (every row of a size is masked)
    scratch: tuple[torch.Tensor, torch.Tensor]  # the kernel's keys and counts (bitmask.argmax_scratch)


# A decode graph's greedy argmax on CUDA: the split-row kernel (``bitmask.argmax_``, a row's
# vocabulary over two programs at 256 rows, publishing into the FutureMap itself), or with
# ``ASERVE_GRAPH_ARGMAX=torch`` torch's (one block a row) and an index_put (to measure).
SPLIT_ARGMAX = os.environ.get("ASERVE_GRAPH_ARGMAX", "split") != "torch"


def capture_graphs(
    device: torch.device, stream: Any, title: str, statics: Sequence[S], body: Callable[[S], R]
) -> list[tuple[Any, R]]:
    """One CUDA graph per set of static buffers, in the order given (largest first, so the
    others fit in the memory the first one's pool holds), all sharing one memory pool. Each
    body runs once before its capture (Triton compiles, cuBLAS picks its kernels). Returns
    each graph and what its captured body returned (outputs that live in the pool)."""
    pool, out = None, []
    with phase(title, unit="graph") as update:
        for i, s in enumerate(statics):
            with torch.cuda.stream(stream):
                body(s)
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream, pool=pool):
                result = body(s)
            pool = graph.pool()
            out.append((graph, result))
            update(i + 1, len(statics))
    return out


def ladder(max_batch: int) -> list[int]:
    """Padded batch sizes, one graph each: 1, 2, 4, 8, then every 8 to 64, every 16 to 256 and
    every 32 beyond, and ``max_batch`` itself: a batch pads by at most 15 rows up to 256 (31
    beyond), where powers of two alone padded 129 requests to 256 (half the step wasted)."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b = b * 2 if b < 8 else b + (8 if b < 64 else 16 if b < 256 else 32)
    sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    def __init__(
        self, model: torch.nn.Module, pool: KVPool, future_map: FutureMap, device: torch.device, max_batch: int
    ) -> None:
        self.model = model
        self.pool = pool
        self.future_map = future_map
        self.device = device
        self.sizes = ladder(max_batch)
        future_map.tokens[pool.pad_row] = 0  # padded rows gather from here (debug poisons the rest)
        self._static = {b: self._buffers(b) for b in self.sizes}
        # The split-row argmax's rows (0, 1, ...) and scratch, shared by every size (CUDA).
        self._argmax: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] | None = None
        if device.type == "cuda" and SPLIT_ARGMAX:
            from aserve.kernels.bitmask import argmax_scratch

            self._argmax = torch.arange(self.sizes[-1], device=device), argmax_scratch(self.sizes[-1], device)
        self.runs = 0  # decode steps served from the static buffers (replays on CUDA)
        self._masked: dict[int, Any] = {}  # size -> the masked argmax's graph (CUDA)
        self.masked: _MaskedBuffers | None = None  # their buffers, once captured
        self.masked_runs = 0  # masked argmaxes replayed (masked_argmax)

    def _buffers(self, b: int) -> _Static:
        inputs = torch.empty(3, b, dtype=torch.int64, device=self.device)
        inputs[0].fill_(self.pool.pad_row)
        inputs[1].fill_(-1)
        inputs[2].fill_(self.pool.pad_slot)
        return _Static(b, inputs)

    def padded_size(self, n: int) -> int | None:
        """The captured batch size a step of ``n`` decodes replays (None: larger than any)."""
        return next((x for x in self.sizes if x >= n), None)

    def host_inputs(self, rows: list[int], positions: list[int], slots: list[int]) -> list[int] | None:
        """The step's graph input padded to its ladder size ([3, Bp] int64, row-major, flat),
        or None when the batch is larger than the largest graph."""
        pad = self.padded_size(len(rows))
        if pad is None:
            return None
        n = pad - len(rows)
        return rows + [self.pool.pad_row] * n + positions + [-1] * n + slots + [self.pool.pad_slot] * n

    def _body(self, s: _Static) -> GraphOutputs:
        rows, pos, slots = s.inputs[0], s.inputs[1], s.inputs[2]
        b = s.size
        positions = pos.clamp(min=0)
        table = self.pool.table_device
        table[rows, positions] = slots
        input_ids = self.future_map.tokens[rows]
        meta = AttentionMetadata(
            positions=positions,
            out_cache_loc=slots,
            req_pool_indices=rows,
            prefix_lens=positions,
            extend_lens=torch.ones(b, dtype=torch.int64, device=self.device),
            seq_lens=pos + 1,  # padded rows: 0, they read no key
            req_to_token=table,
            logits_indices=torch.arange(b, device=self.device),
            prefix_lens_cpu=[0] * b,
            extend_lens_cpu=[1] * b,
            backend="triton",
            seq_len_bound=self.pool.max_context,
        )
        with torch.inference_mode():
            logits = self.model(input_ids, meta, self.pool.kv_cache, head_dtype=True)  # [Bp, V]
            if self._argmax is not None:
                from aserve.kernels.bitmask import argmax_

                tokens = torch.empty(b, dtype=torch.int64, device=self.device)
                index, scratch = self._argmax
                argmax_(tokens, logits, index[:b], (self.future_map.tokens, rows), scratch)
            else:
                tokens = logits.argmax(dim=-1)
                self.future_map.tokens[rows] = tokens
        return GraphOutputs(logits, tokens, input_ids)

    def capture(self, stream: Any) -> None:
        """CUDA: capture one graph per size (largest first, sharing one memory pool)."""
        if self.device.type != "cuda":
            return
        torch.cuda.synchronize(self.device)  # buffers filled on the current stream; capture runs on ``stream``
        # Warm-up and capture write into the spare rows only (all inputs are padding).
        statics = [self._static[b] for b in reversed(self.sizes)]
        for s, (graph, out) in zip(statics, capture_graphs(self.device, stream, "capturing decode CUDA graphs",
                                                           statics, self._body)):  # fmt: skip
            s.graph, s.out = graph, out

    def capture_masked(self, stream: Any) -> None:
        """CUDA, after :meth:`capture`: one masked-argmax graph per size over that size's
        logits, sharing the static masks and tokens (largest first). Like the decode graphs'
        their warm-up publishes into the spare row only (every input is padding)."""
        if self.device.type != "cuda" or not self._static:
            return
        from aserve.kernels.bitmask import argmax_scratch, masked_argmax_
        from aserve.sampling.masks import mask_words

        top = self._static[self.sizes[-1]]
        assert top.out is not None, "capture the decode graphs first"
        words = mask_words(top.out.logits.shape[1])
        n = top.size
        # Every tensor a graph reads lives as long as the graphs (here, not in the closure).
        m = self.masked = _MaskedBuffers(
            torch.full((n, words), -1, dtype=torch.int32).pin_memory(),
            torch.full((n, words), -1, dtype=torch.int32, device=self.device),
            torch.empty(n, dtype=torch.int64, device=self.device),
            torch.empty(n, dtype=torch.int64, pin_memory=True),
            torch.arange(n, device=self.device),
            argmax_scratch(n, self.device),
        )
        torch.cuda.synchronize(self.device)  # made on the current stream; the warm-ups run on ``stream``

        def body(s: _Static) -> None:
            b = s.size
            assert s.out is not None
            masked_argmax_(m.device_tokens[:b], s.out.logits, m.rows[:b], m.device_bits[:b],
                           (self.future_map.tokens, s.inputs[0]), m.scratch)  # fmt: skip
            m.host_tokens[:b].copy_(m.device_tokens[:b], non_blocking=True)

        statics = [self._static[b] for b in reversed(self.sizes)]
        captured = capture_graphs(self.device, stream, "capturing masked-argmax CUDA graphs", statics, body)
        self._masked = {s.size: graph for s, (graph, _) in zip(statics, captured, strict=True)}

    def upload_masks(self, size: int) -> None:
        """On the current stream: the first ``size`` rows of ``masked.host_bits`` to the device
        (``masked.device_bits``), where :meth:`masked_argmax` reads them. Kept out of that graph
        so that the copy can run on another stream while the device still runs the step's
        forward (32 KiB a row at a 262k vocabulary: 8 MiB at 256 rows)."""
        m = self.masked
        assert m is not None
        m.device_bits[:size].copy_(m.host_bits[:size], non_blocking=True)

    def masked_argmax(self, size: int) -> None:
        """On the current stream, after the size-``size`` decode graph's replay and the masks'
        upload (:meth:`upload_masks`, ordered before this on the device): each of its rows'
        argmax over the tokens its mask allows, published into the FutureMap and copied to
        ``masked.host_tokens`` (every row of the bucket: a padded row's token goes to the spare
        row, from a stale mask or an all-allowed one). Neither buffer may be touched again
        until the work is done."""
        self._masked[size].replay()
        self.masked_runs += 1

    def has_masked(self, size: int, words: int) -> bool:
        """Whether a masked-argmax graph serves a step of this padded size with masks of
        ``words`` words a row."""
        return size in self._masked and self.masked is not None and words == self.masked.host_bits.shape[1]

    def logits_row(self) -> torch.Tensor | None:
        """A row of the captured graphs' logits (their head's dtype and width), None before
        :meth:`capture`; what a kernel that reads them is compiled for ahead of a step."""
        out = self._static[self.sizes[0]].out
        return None if out is None else out.logits[:1]

    def replay_seconds(self, size: int, replays: int = 20) -> float:
        """Device seconds per replay of the size-``size`` graph, its buffers as the last step
        left them (a benchmark's measure of a decode step's device time alone, with no host
        work between replays; it rewrites that step's K/V slots with the same values)."""
        s = self._static[size]
        assert s.graph is not None, "no captured graph (CUDA only)"
        s.graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            s.graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / replays

    def release(self) -> None:
        """The engine closed: drop the graphs (and with them their memory pool) and buffers."""
        for g in self._masked.values():
            g.reset()
        self._masked.clear()
        self.masked = None
        for s in self._static.values():
            if s.graph is not None:
                s.graph.reset()
        self._static.clear()
        self._argmax = None

    def run(self, graph_inputs: torch.Tensor) -> GraphOutputs:
        """Replay (CUDA) or run (CPU) the graph for ``graph_inputs`` ([3, Bp] on the device)."""
        s = self._static[graph_inputs.shape[1]]
        s.inputs.copy_(graph_inputs)
        self.runs += 1
        if s.graph is not None:
            s.graph.replay()
            assert s.out is not None
            return s.out
        return self._body(s)

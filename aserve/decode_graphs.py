"""Decode steps replayed from CUDA graphs, one graph per padded batch size.

A decode-only step's model forward has a fixed shape once the batch is padded to the next
size of a ladder (1, 2, 4, ..., max): the inputs live in static buffers, the attention is
the Triton decode kernel, whose grid depends only on the padded batch size (each program
covers a fixed fraction of its sequence's real length), padded rows have ``seq_len == 0`` (they read no key) and write their K/V to the pool's pad slot.
Replaying the captured forward costs one launch instead of hundreds.

On a CPU there is nothing to capture: the same static-buffer path runs directly, which is
how the padding and bucketing logic is tested in CI. The FutureMap gather, the table
update and the sampler stay outside the graph (they run eagerly, a few kernels).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from aserve.attention.metadata import AttentionMetadata
from aserve.kv.pool import KVPool


@dataclass
class _Static:
    size: int
    input_ids: torch.Tensor  # [Bp] int64
    positions: torch.Tensor  # [Bp]
    out_loc: torch.Tensor  # [Bp]
    rows: torch.Tensor  # [Bp]
    prefix: torch.Tensor  # [Bp]
    seq_lens: torch.Tensor  # [Bp]
    meta: AttentionMetadata
    logits: torch.Tensor | None = None  # [Bp, V], the graph's output buffer
    graph: Any = None  # torch.cuda.CUDAGraph on CUDA


def ladder(max_batch: int) -> list[int]:
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, pool: KVPool, device: torch.device, max_batch: int) -> None:
        self.model = model
        self.pool = pool
        self.device = device
        self.sizes = ladder(max_batch)
        self._static = {b: self._buffers(b) for b in self.sizes}
        self.runs = 0  # decode steps served from the static buffers (replays on CUDA)

    def _buffers(self, b: int) -> _Static:
        def zeros() -> torch.Tensor:
            return torch.zeros(b, dtype=torch.int64, device=self.device)

        s = _Static(b, zeros(), zeros(), zeros(), zeros(), zeros(), zeros(), meta=None)  # type: ignore[arg-type]
        s.out_loc.fill_(self.pool.pad_slot)
        s.meta = AttentionMetadata(
            positions=s.positions,
            out_cache_loc=s.out_loc,
            req_pool_indices=s.rows,
            prefix_lens=s.prefix,
            extend_lens=torch.ones(b, dtype=torch.int64, device=self.device),
            seq_lens=s.seq_lens,
            req_to_token=self.pool.table_device,
            logits_indices=torch.arange(b, device=self.device),
            prefix_lens_cpu=[0] * b,
            extend_lens_cpu=[1] * b,
            backend="triton",
        )
        return s

    def _forward(self, s: _Static) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(s.input_ids, s.meta, self.pool.kv_cache)  # type: ignore[no-any-return]

    def capture(self, stream: Any) -> None:
        """CUDA: capture one graph per size (largest first, sharing one memory pool)."""
        if self.device.type != "cuda":
            return
        pool = None
        for i, b in enumerate(reversed(self.sizes)):
            s = self._static[b]
            with torch.cuda.stream(stream):
                self._forward(s)  # warm-up: Triton compiles, cuBLAS picks its kernels
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream, pool=pool):
                s.logits = self._forward(s)
            pool = graph.pool()
            s.graph = graph
            print(f"\rcapturing decode CUDA graphs: {i + 1}/{len(self.sizes)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)

    def fits(self, batch: int) -> bool:
        return batch <= self.sizes[-1]

    def run(self, input_ids: torch.Tensor, dev: dict[str, Any]) -> torch.Tensor:
        """Decode forward for ``B = len(input_ids)`` sequences -> logits [B, V]."""
        b = input_ids.shape[0]
        size = next(x for x in self.sizes if x >= b)
        s = self._static[size]
        for buf, src, pad in (
            (s.input_ids, input_ids, 0),
            (s.positions, dev["positions"], 0),
            (s.out_loc, dev["slots"], self.pool.pad_slot),
            (s.rows, dev["rows"], 0),
            (s.prefix, dev["prefix"], 0),
        ):
            buf[:b].copy_(src)
            buf[b:].fill_(pad)
        s.seq_lens[:b].copy_(dev["prefix"] + 1)
        s.seq_lens[b:].fill_(0)  # padded rows read no key
        self.runs += 1
        if s.graph is not None:
            s.graph.replay()
            assert s.logits is not None
            return s.logits[:b]
        return self._forward(s)[:b]

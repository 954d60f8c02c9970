"""Prefill and mixed steps replayed from CUDA graphs, one graph per padded token count.

A step that carries a prompt chunk (alone, or with the decodes of a mixed batch) used to run
the model eagerly. On the H200 its launch, about 130 Triton launches and a GEMM of a new shape
each step, took longer than its device work (W1, Gemma 3 270M shape: 19 ms of launch against
16.5 ms of device time at the median), so the device waited on the host. Padded to the next
rung of a token ladder, with its sequences padded to a bound, such a step has a fixed shape:
the forward is captured once per rung and replayed.

A graph's input is one int64 vector, ``[3 * Tp + 4 * Bp]`` (Tp tokens, Bp sequences):

========== ======== =====================================================================
field      length   padding
========== ======== =====================================================================
input_ids  Tp       0; the decodes' places are filled from the FutureMap before the replay
positions  Tp       0
slots      Tp       the pool's pad slot (padding tokens' K/V land there)
rows       Bp       the pool's spare table row
prefix     Bp       0
extend     Bp       0: a padding sequence has no query block
logits_idx Bp       0
========== ======== =====================================================================

The extend kernel's grid is a bound (``AttentionMetadata.token_bound``): each program finds
its sequence on the device and the spare ones return. The request-to-token table writes and
the decodes' token gather run eagerly before the replay (their sizes vary); the sampler runs
after it on the logits, which every graph writes into one shared float32 buffer (only one
step's forward runs at a time, on the forward stream, and its sampler reads them before the
next replay). Steps that ask for prompt logprobs, or are longer than the largest rung, stay
eager.

On a CPU nothing is captured: the same body runs on the static buffers (how CI tests it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from aserve.attention.metadata import AttentionMetadata
from aserve.device.decode_graphs import capture_graphs
from aserve.kv.pool import KVPool


def token_ladder(max_tokens: int) -> list[int]:
    """Padded token counts, one graph each: powers of two to 128, then each power of two and
    its 1.5x (192, 256, 384, 512, 768, ...), and ``max_tokens`` itself (rounded up to even):
    beyond 128 tokens a step pads by less than half of itself."""
    sizes, t = [], 16
    while t < max_tokens:
        sizes.append(t)
        t = t * 2 if t < 128 else (t * 3 // 2 if t & (t - 1) == 0 else t * 4 // 3)
    sizes.append(max_tokens + max_tokens % 2)  # even, so no rung's sequence bound exceeds its tokens
    return sizes


@dataclass
class _Static:
    tokens: int  # Tp
    seqs: int  # Bp
    inputs: torch.Tensor  # [3 * Tp + 4 * Bp] int64
    graph: Any = None  # torch.cuda.CUDAGraph on CUDA


class ExtendGraphs:
    def __init__(
        self, model: torch.nn.Module, pool: KVPool, device: torch.device, max_tokens: int, max_seqs: int,
        vocab_size: int,
    ) -> None:  # fmt: skip
        self.model = model
        self.pool = pool
        self.device = device
        self.sizes = token_ladder(max_tokens)
        self._static: dict[int, _Static] = {}
        for t in self.sizes:
            b = min(t, max_seqs)
            b += b % 2  # even (t is): the int64 fields after it stay 16-byte aligned; b <= t
            s = _Static(t, b, self._padding(t, b))
            self._static[s.inputs.shape[0]] = s
        self.logits = torch.empty(max(s.seqs for s in self._static.values()), vocab_size, device=device)
        self.runs = 0  # steps served from the static buffers (replays on CUDA)

    def _padding(self, t: int, b: int) -> torch.Tensor:
        x = torch.zeros(3 * t + 4 * b, dtype=torch.int64, device=self.device)
        x[2 * t : 3 * t].fill_(self.pool.pad_slot)
        x[3 * t : 3 * t + b].fill_(self.pool.pad_row)
        return x

    def _rung(self, num_tokens: int, num_seqs: int) -> _Static | None:
        for s in self._static.values():
            if s.tokens >= num_tokens:
                return s if s.seqs >= num_seqs else None
        return None

    def host_inputs(
        self, input_ids: list[int], positions: list[int], slots: list[int], rows: list[int], prefix: list[int],
        extend: list[int], logits_idx: list[int],
    ) -> tuple[list[int], dict[str, tuple[int, int]]] | None:  # fmt: skip
        """The step's padded graph input (flat) and where each unpadded field lies in it
        (offset, length), or None when no graph fits the step."""
        t, b = len(input_ids), len(rows)
        s = self._rung(t, b)
        if s is None:
            return None
        pt, pb = s.tokens - t, s.seqs - b
        flat = input_ids + [0] * pt + positions + [0] * pt + slots + [self.pool.pad_slot] * pt
        flat += rows + [self.pool.pad_row] * pb + prefix + [0] * pb + extend + [0] * pb + logits_idx + [0] * pb
        tp, bp = s.tokens, s.seqs
        spans = {
            "input_ids": (0, t), "positions": (tp, t), "slots": (2 * tp, t),
            "prefix": (3 * tp + bp, b), "extend": (3 * tp + 2 * bp, b), "logits_idx": (3 * tp + 3 * bp, b),
        }  # fmt: skip
        return flat, spans

    def _body(self, s: _Static) -> None:
        t, b, x = s.tokens, s.seqs, s.inputs
        rows, prefix, extend, logits_idx = x[3 * t :].view(4, b)
        meta = AttentionMetadata(
            positions=x[t : 2 * t],
            out_cache_loc=x[2 * t : 3 * t],
            req_pool_indices=rows,
            prefix_lens=prefix,
            extend_lens=extend,
            seq_lens=prefix + extend,
            req_to_token=self.pool.table_device,
            logits_indices=logits_idx,
            prefix_lens_cpu=[],
            extend_lens_cpu=[],
            backend="triton",
            seq_len_bound=self.pool.max_context,
            token_bound=t,
        )
        with torch.inference_mode():
            self.model(x[:t], meta, self.pool.kv_cache, out=self.logits[:b])

    def capture(self, stream: Any) -> None:
        """CUDA: capture one graph per rung (largest first, sharing one memory pool)."""
        if self.device.type != "cuda":
            return
        statics = sorted(self._static.values(), key=lambda s: -s.tokens)
        for s, (graph, _) in zip(statics, capture_graphs(self.device, stream, "capturing prefill CUDA graphs",
                                                         statics, self._body)):  # fmt: skip
            s.graph = graph

    def release(self) -> None:
        """The engine closed: drop the graphs (and with them their memory pool) and buffers."""
        for s in self._static.values():
            if s.graph is not None:
                s.graph.reset()
        self._static.clear()
        self.logits = torch.empty(0)

    def run(
        self, graph_inputs: torch.Tensor, decode_idx: torch.Tensor, decode_tokens: torch.Tensor | None
    ) -> torch.Tensor:
        """Replay (CUDA) or run (CPU) the graph for ``graph_inputs`` (flat, on the device), the
        decodes' input tokens placed first; returns the logits [Bp, V] (the shared buffer)."""
        s = self._static[graph_inputs.shape[0]]
        s.inputs.copy_(graph_inputs)
        if decode_tokens is not None:
            s.inputs.index_put_((decode_idx,), decode_tokens)
        self.runs += 1
        if s.graph is not None:
            s.graph.replay()
        else:
            self._body(s)
        return self.logits[: s.seqs]

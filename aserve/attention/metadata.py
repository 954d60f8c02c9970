"""What one forward needs to read and write the paged KV cache.

A forward runs over a flat list of ``T`` new tokens belonging to ``B`` sequences, in
sequence order. Sequence ``i`` owns row ``req_pool_indices[i]`` of the request-to-token
table; its first ``prefix_lens[i]`` tokens are already in the cache, and this step adds
``extend_lens[i]`` more (1 for a decode, a chunk for a prefill). ``seq_lens = prefix + extend``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    positions: torch.Tensor  # [T] int64, absolute position of each new token
    out_cache_loc: torch.Tensor  # [T] int64, KV slot each new token's K/V is written to
    req_pool_indices: torch.Tensor  # [B] int64
    prefix_lens: torch.Tensor  # [B] int64
    extend_lens: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64
    req_to_token: torch.Tensor  # [num_rows, max_context] int64 slot table (shared, not copied)
    logits_indices: torch.Tensor  # [B] int64, index into T of each sequence's last new token
    # Host copies of the per-sequence lengths: the reference path pads with them.
    prefix_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    # Per-forward derived tensors (padded indices, masks) that attention backends build once
    # and reuse across layers; keyed by the backend's own keys (e.g. the sliding window).
    cache: dict[Any, Any] = field(default_factory=dict)
    backend: str = "torch"  # "torch" (reference) or "triton" (aserve/attention/triton_paged.py)
    # Upper bound on any sequence's length for kernels whose grid must not depend on the
    # step (decode graphs: the pool's max_context); None: taken from the host lengths.
    seq_len_bound: int | None = None
    # A fixed-shape extend step (a CUDA graph's, aserve/device/extend_graphs.py): T is a padded
    # bound, its padding tokens belong to no sequence, and the host lengths are not given.
    token_bound: int | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.extend_lens_cpu)

    # Cached: every attention layer of a forward asks (an H200 profile of W1's mixed steps
    # charged ~0.6 ms a step to recomputing them over ~255 sequences in each of 18 layers).
    @cached_property
    def num_tokens(self) -> int:
        return int(sum(self.extend_lens_cpu))

    @cached_property
    def max_extend(self) -> int:
        return max(self.extend_lens_cpu)

    @cached_property
    def max_seq_len(self) -> int:
        return max(p + e for p, e in zip(self.prefix_lens_cpu, self.extend_lens_cpu))

    @cached_property
    def all_decode(self) -> bool:
        """Every sequence adds one token (a decode step)."""
        return self.token_bound is None and all(e == 1 for e in self.extend_lens_cpu)


def build_metadata(
    req_to_token: torch.Tensor,
    rows: list[int],
    prefix_lens: list[int],
    extend_lens: list[int],
    device: torch.device | str,
) -> AttentionMetadata:
    """Build metadata on the host from plain lists, then move it to ``device``.

    ``req_to_token[row, prefix:prefix+extend]`` must already hold the slots of the new tokens.
    """
    positions: list[int] = []
    out_loc_parts: list[torch.Tensor] = []
    logits_idx: list[int] = []
    offset = 0
    table_cpu = req_to_token if req_to_token.device.type == "cpu" else None
    for row, p, e in zip(rows, prefix_lens, extend_lens):
        positions.extend(range(p, p + e))
        if table_cpu is not None:
            out_loc_parts.append(table_cpu[row, p : p + e])
        offset += e
        logits_idx.append(offset - 1)
    dev = torch.device(device)
    if table_cpu is not None:
        out_cache_loc = torch.cat(out_loc_parts).to(torch.int64)
    else:
        out_cache_loc = torch.cat(
            [req_to_token[row, p : p + e] for row, p, e in zip(rows, prefix_lens, extend_lens)]
        ).to(torch.int64)
    return AttentionMetadata(
        positions=torch.tensor(positions, dtype=torch.int64).to(dev),
        out_cache_loc=out_cache_loc.to(dev),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64).to(dev),
        prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64).to(dev),
        extend_lens=torch.tensor(extend_lens, dtype=torch.int64).to(dev),
        seq_lens=torch.tensor([p + e for p, e in zip(prefix_lens, extend_lens)], dtype=torch.int64).to(dev),
        req_to_token=req_to_token,
        logits_indices=torch.tensor(logits_idx, dtype=torch.int64).to(dev),
        prefix_lens_cpu=list(prefix_lens),
        extend_lens_cpu=list(extend_lens),
    )

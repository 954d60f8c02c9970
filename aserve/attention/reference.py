"""Reference paged attention in plain PyTorch (CPU and CUDA).

Every sequence of the batch is padded to ``[maxQ]`` new tokens and ``[maxKV]`` cached
keys, so one ``scaled_dot_product_attention`` call covers prefills, chunked prefills and
decodes together. The padded index/mask tensors depend only on the metadata (and the
sliding window), so they are built once per forward and cached on ``meta.cache``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aserve.attention.metadata import AttentionMetadata

_KV_ALIGN = 64


@dataclass(frozen=True)
class PaddedLayout:
    kv_slots: torch.Tensor  # [B, maxKV] int64 cache slot of each key (0 where padded)
    q_index: torch.Tensor  # [B, maxQ] int64 index into T of each query (0 where padded)
    out_index: torch.Tensor  # [T] int64 flat index into [B * maxQ] of each real query
    mask: torch.Tensor  # [B, 1, maxQ, maxKV] bool, True = may attend


def _base_layout(meta: AttentionMetadata) -> tuple[torch.Tensor, ...]:
    """Window-independent tensors, computed on the device from the metadata's device tensors;
    only sizes come from the host lists, so nothing waits on the GPU or copies host->device."""
    key = "ref_base"
    if key in meta.cache:
        return meta.cache[key]  # type: ignore[no-any-return]
    dev = meta.positions.device
    bsz, max_q, total = meta.num_seqs, meta.max_extend, meta.num_tokens
    # Round the key length up: a mask whose last dim is a multiple of 64 keeps SDPA on its
    # memory-efficient CUDA kernel (alignment), and far fewer distinct shapes reach it.
    max_kv = min(-(-meta.max_seq_len // _KV_ALIGN) * _KV_ALIGN, meta.req_to_token.shape[1])
    j = torch.arange(max_q, device=dev)  # [maxQ]
    q_valid = j[None, :] < meta.extend_lens[:, None]  # [B, maxQ]
    starts = torch.cumsum(meta.extend_lens, 0) - meta.extend_lens  # [B] first token of each seq
    q_index = torch.where(q_valid, starts[:, None] + j[None, :], 0)  # [B, maxQ]
    q_pos = meta.prefix_lens[:, None] + j[None, :]  # [B, maxQ]
    # Sequence of each token; output_size keeps repeat_interleave from syncing.
    seq_of = torch.repeat_interleave(torch.arange(bsz, device=dev), meta.extend_lens, output_size=total)  # [T]
    out_index = seq_of * max_q + (meta.positions - meta.prefix_lens[seq_of])  # [T]
    kv_pos = torch.arange(max_kv, device=dev)  # [maxKV]
    kv_valid = kv_pos[None, :] < meta.seq_lens[:, None]  # [B, maxKV]
    table = meta.req_to_token[meta.req_pool_indices, :max_kv]  # [B, maxKV]
    kv_slots = torch.where(kv_valid, table, 0).to(torch.int64)
    base = (kv_slots, q_index, out_index, q_valid, q_pos, kv_valid)
    meta.cache[key] = base
    return base


def padded_layout(meta: AttentionMetadata, sliding_window: int | None) -> PaddedLayout:
    key = ("ref_layout", sliding_window)
    cached = meta.cache.get(key)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    kv_slots, q_index, out_index, q_valid, q_pos, kv_valid = _base_layout(meta)
    kv_pos = torch.arange(kv_valid.shape[1], device=kv_valid.device)  # [maxKV]
    allowed = (kv_pos[None, None, :] <= q_pos[:, :, None]) & kv_valid[:, None, :]  # [B, maxQ, maxKV]
    if sliding_window is not None:
        allowed &= kv_pos[None, None, :] > q_pos[:, :, None] - sliding_window
    # Padded query rows would be fully masked (NaN in softmax); let them see key 0 and
    # drop their output afterwards.
    allowed |= ~q_valid[:, :, None] & (kv_pos[None, None, :] == 0)
    layout = PaddedLayout(kv_slots, q_index, out_index, allowed[:, None])
    meta.cache[key] = layout
    return layout


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
) -> None:
    """Store the new tokens' K/V ([T, Hkv, D]) at their slots; every backend does this first."""
    k_cache.index_copy_(0, meta.out_cache_loc, k.to(k_cache.dtype))
    v_cache.index_copy_(0, meta.out_cache_loc, v.to(v_cache.dtype))


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Write new K/V into the cache, then attend causally over each sequence's keys.

    q: [T, H, D]; k, v: [T, Hkv, D]; k_cache, v_cache: [num_slots, Hkv, D]. Returns [T, H, D].
    """
    _, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    write_kv(k, v, k_cache, v_cache, meta)
    lay = padded_layout(meta, sliding_window)
    bsz, max_q = lay.q_index.shape
    qp = _rows(q, lay.q_index).transpose(1, 2)  # [B, H, maxQ, D]
    kp = _rows(k_cache, lay.kv_slots).transpose(1, 2).to(q.dtype)  # [B, Hkv, maxKV, D]
    vp = _rows(v_cache, lay.kv_slots).transpose(1, 2).to(q.dtype)  # [B, Hkv, maxKV, D]
    if softcap is None:
        gqa = num_heads != num_kv_heads
        if gqa and q.is_cuda:
            # SDPA's masked CUDA kernels take no grouped-query heads (it would fall back to
            # the slow math path): repeat the KV heads instead.
            group = num_heads // num_kv_heads
            kp = kp[:, :, None].expand(-1, -1, group, -1, -1).reshape(bsz, num_heads, -1, head_dim)
            vp = vp[:, :, None].expand(-1, -1, group, -1, -1).reshape(bsz, num_heads, -1, head_dim)
            gqa = False
        out = F.scaled_dot_product_attention(
            qp, kp, vp, attn_mask=lay.mask, scale=scale, enable_gqa=gqa
        )  # [B, H, maxQ, D]
    else:
        # SDPA has no logit soft-capping; do the math explicitly.
        group = num_heads // num_kv_heads
        kp = kp.repeat_interleave(group, dim=1)  # [B, H, maxKV, D]
        vp = vp.repeat_interleave(group, dim=1)
        scores = torch.matmul(qp, kp.transpose(2, 3)) * scale  # [B, H, maxQ, maxKV]
        scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~lay.mask, float("-inf"))
        # Softmax in at least float32 (float64 stays float64 for the reference tests).
        acc = torch.promote_types(scores.dtype, torch.float32)
        probs = torch.softmax(scores.to(acc), dim=-1).to(q.dtype)
        out = torch.matmul(probs, vp)
    out = out.transpose(1, 2).reshape(bsz * max_q, num_heads, head_dim)  # [B*maxQ, H, D]
    return out.index_select(0, lay.out_index)  # [T, H, D]


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]`` for an integer ``index`` of any shape over ``x``'s first dimension.

    ``index_select`` copies whole rows where advanced indexing goes element by element: on a
    CPU it gathers the keys of a decode step about 4x faster (docs/benchmarks.md, issue 20)."""
    return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:])

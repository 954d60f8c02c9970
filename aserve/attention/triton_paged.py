"""Paged attention in Triton: a split-K decode kernel and a variable-length extend kernel.

Both read keys and values straight from the paged cache through the request-to-token
table (no padded gather), handle grouped-query attention (one program serves a whole group
of query heads that share a KV head) and Gemma 3's sliding window. The new tokens' K/V are
written into the cache first, exactly as in the reference path, so every key is read from
the cache.

* decode (every sequence adds one token): grid (batch, KV heads, splits); each program
  runs an online softmax over one split of the context and writes a partial output and its
  log-sum-exp; the splits are merged with a few tensor ops. Splitting along the context
  keeps the GPU busy when the batch is small and contexts are long.
* extend (prefills, chunked prefills, mixed batches): grid (query blocks, query heads), each
  block mapped to its sequence on the device, so a CUDA graph can fix the grid at a bound;
  causal against prefix + the block's own tokens.

Written here; checked against the torch reference (``aserve/attention/reference.py``) on
random shapes, on the GPU and on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``).
Selected with ``EngineConfig(attention_backend="triton")``; soft-capped attention stays on
the reference path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from aserve.attention.metadata import AttentionMetadata
from aserve.attention.reference import write_kv
from aserve.kernels.pdl import launch_args, wait_for_prior

_NEG = tl.constexpr(-1.0e30)  # finite "minus infinity": a fully masked row stays NaN-free
_TARGET_PROGRAMS = 512  # about four per SM on an H200 (132 SMs)
_MAX_SPLITS = 32
_MIN_SPLIT_LEN = 128  # keys; shorter splits cost more in the merge than they gain


@triton.jit
def _attend_block(
    q, m_i, l_i, acc, offs, k_mask, allowed, K, V, Table, row, kvh, d,
    stride_ks, stride_kh, stride_vs, stride_vh, stride_tr, scale, PRECISION: tl.constexpr,
):  # fmt: skip
    """One step of the online softmax (flash attention) shared by both kernels: the query rows
    ``q`` [R, D] against the keys at positions ``offs`` [BLOCK_N] of table row ``row`` (KV head
    ``kvh``; ``k_mask``: positions to read), scores outside ``allowed`` ([R or 1, BLOCK_N])
    masked. Returns the running max ``m_i`` [R], sum ``l_i`` [R] and unnormalised output
    ``acc`` [R, D], rescaled to the new max and with this block added."""
    slots = tl.load(Table + row * stride_tr + offs, mask=k_mask, other=0).to(tl.int64)
    kvh = kvh.to(tl.int64)  # a head-major cache's head stride is slots x head_dim: 32 bits overflow
    k = tl.load(K + slots[:, None] * stride_ks + kvh * stride_kh + d[None, :], mask=k_mask[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * scale  # [R, BLOCK_N]
    s = tl.where(allowed, s, _NEG)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp(s - m_new[:, None])
    p = tl.where(allowed, p, 0.0)  # a row with nothing allowed so far has m_new = _NEG: exp(0) there
    alpha = tl.exp(m_i - m_new)
    v = tl.load(V + slots[:, None] * stride_vs + kvh * stride_vh + d[None, :], mask=k_mask[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION).to(tl.float32)
    l_i = l_i * alpha + tl.sum(p, 1)
    return m_new, l_i, acc


@triton.jit
def _decode_split_kernel(
    Q, K, V, Table, Rows, SeqLens, MidO, MidLse, Out, Count,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_tr,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ot, stride_oh,
    scale, window,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr, INLINE_MERGE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + b)
    row = tl.load(Rows + b).to(tl.int64)
    lo = seq_len * 0
    if HAS_WINDOW:
        lo = tl.maximum(lo, seq_len - window)  # keys with pos > q_pos - window, q_pos = seq_len - 1
    # This sequence's live keys [lo, seq_len) are cut into NUM_SPLITS block-aligned pieces,
    # so the work per program follows the real length (the grid is fixed for CUDA graphs).
    per_split = tl.cdiv(tl.cdiv(seq_len - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(start + per_split, seq_len)
    g = tl.arange(0, BLOCK_G)
    heads = kvh * GROUP + g
    g_mask = g < GROUP
    d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=g_mask[:, None], other=0.0)
    m_i = tl.full([BLOCK_G], _NEG, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for n in range(start, end, BLOCK_N):
        offs = n + tl.arange(0, BLOCK_N)
        k_mask = offs < end
        m_i, l_i, acc = _attend_block(
            q, m_i, l_i, acc, offs, k_mask, k_mask[None, :], K, V, Table, row, kvh, d,
            stride_ks, stride_kh, stride_vs, stride_vh, stride_tr, scale, PRECISION,
        )  # fmt: skip
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]  # an empty sequence: zeros
    if NUM_SPLITS == 1:  # the whole context in one program: the output itself, no merge
        o_ptrs = Out + b * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=g_mask[:, None])
    else:
        lse = tl.where(empty, _NEG, m_i + tl.log(tl.where(empty, 1.0, l_i)))
        o_ptrs = MidO + b * stride_mb + heads[:, None] * stride_mh + split * stride_ms + d[None, :]
        tl.store(o_ptrs, out, mask=g_mask[:, None])
        tl.store(MidLse + b * stride_lb + heads * stride_lh + split, lse, mask=g_mask)
        if INLINE_MERGE:
            # The last of this (token, KV head)'s programs to finish merges the splits (no merge
            # kernel): every thread's stores above are issued (barrier) before the counter's
            # release; the last program's acquire makes the others' partials visible to it.
            tl.debug_barrier()
            arrived = tl.atomic_add(Count + b * tl.num_programs(1) + kvh, 1, sem="acq_rel", scope="gpu")
            if arrived == NUM_SPLITS - 1:
                tl.debug_barrier()  # every thread after the one that took the counter's acquire
                _merge_splits(MidO, MidLse, Out, b, heads, g_mask, d, stride_mb, stride_mh, stride_ms, stride_lb,
                              stride_lh, stride_ot, stride_oh, NUM_SPLITS, BLOCK_G, D)  # fmt: skip
                tl.atomic_xchg(Count + b * tl.num_programs(1) + kvh, 0, sem="relaxed", scope="gpu")  # next launch


@triton.jit
def _merge_splits(
    MidO, MidLse, Out, b, heads, g_mask, d, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Heads ``heads`` of token ``b``: the splits' partial outputs weighted by exp(lse_s - max
    lse), summed split by split; read past L1 (``.cg``), which may not have seen other
    programs' stores. The split kernel's inline merge and ``_decode_merge_kernel`` share it."""
    s = tl.arange(0, NUM_SPLITS)
    lse = tl.load(MidLse + b * stride_lb + heads[:, None] * stride_lh + s[None, :], mask=g_mask[:, None],
                  other=0.0, cache_modifier=".cg")  # fmt: skip
    top = tl.max(lse, 1)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    for k in range(NUM_SPLITS):
        lse_k = tl.load(MidLse + b * stride_lb + heads * stride_lh + k, mask=g_mask, other=0.0, cache_modifier=".cg")
        w = tl.exp(lse_k - top)  # empty splits: exp(-1e30 - max) = 0; all empty: out = 0
        o = tl.load(MidO + b * stride_mb + heads[:, None] * stride_mh + k * stride_ms + d[None, :],
                    mask=g_mask[:, None], other=0.0, cache_modifier=".cg")  # fmt: skip
        acc += o * w[:, None]
        total += w
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(Out + b * stride_ot + heads[:, None] * stride_oh + d[None, :], out.to(Out.dtype.element_ty),
             mask=g_mask[:, None])  # fmt: skip


@triton.jit
def _decode_merge_kernel(
    MidO, MidLse, Out, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One (token, head): the merge the split kernel does inline (``_merge_splits``), as a kernel."""
    wait_for_prior(PDL)
    head = tl.program_id(1) + tl.arange(0, 1)
    _merge_splits(MidO, MidLse, Out, tl.program_id(0), head, head >= 0, tl.arange(0, D), stride_mb, stride_mh,
                  stride_ms, stride_lb, stride_lh, stride_ot, stride_oh, NUM_SPLITS, 1, D)  # fmt: skip


@triton.jit(do_not_specialize=["num_seqs"])  # any batch size: one compiled kernel
def _extend_kernel(
    Q, K, V, Out, Table, Rows, Prefix, Extend, QStart, BlockSeq, BlockIdx,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_tr,
    scale, window, num_seqs,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    # One program per (query block, head): BlockSeq/BlockIdx name the block's sequence and its
    # index within the sequence; a sequence index of num_seqs marks a spare program (the grid is
    # a bound when the step is a CUDA graph's).
    blk = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.load(BlockSeq + blk)
    if b < num_seqs:
        mb = tl.load(BlockIdx + blk)
        extend = tl.load(Extend + b)
        prefix = tl.load(Prefix + b)
        q0 = tl.load(QStart + b).to(tl.int64)
        row = tl.load(Rows + b).to(tl.int64)
        kvh = h // GROUP
        m_offs = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        m_mask = m_offs < extend
        d = tl.arange(0, D)
        q = tl.load(
            Q + (q0 + m_offs)[:, None] * stride_qt + h * stride_qh + d[None, :], mask=m_mask[:, None], other=0.0
        )
        q_pos = prefix + m_offs  # [BLOCK_M]
        kv_end = tl.minimum(prefix + extend, prefix + (mb + 1) * BLOCK_M)
        kv_lo = 0
        if HAS_WINDOW:
            kv_lo = tl.maximum(0, prefix + mb * BLOCK_M - window + 1)
            kv_lo = (kv_lo // BLOCK_N) * BLOCK_N
        m_i = tl.full([BLOCK_M], _NEG, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for n in range(kv_lo, kv_end, BLOCK_N):
            offs = n + tl.arange(0, BLOCK_N)
            k_mask = offs < kv_end
            allowed = k_mask[None, :] & (offs[None, :] <= q_pos[:, None])  # [BLOCK_M, BLOCK_N]
            if HAS_WINDOW:
                allowed = allowed & (offs[None, :] > q_pos[:, None] - window)
            m_i, l_i, acc = _attend_block(
                q, m_i, l_i, acc, offs, k_mask, allowed, K, V, Table, row, kvh, d,
                stride_ks, stride_kh, stride_vs, stride_vh, stride_tr, scale, PRECISION,
            )  # fmt: skip
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_ptrs = Out + (q0 + m_offs)[:, None] * stride_ot + h * stride_oh + d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_mask[:, None])


def num_decode_splits(num_tokens: int, kv_heads: int, max_seq_len: int) -> int:
    """Context splits per (token, KV head): enough programs to fill the GPU (a power of two
    <= 32), no more than one per ``_MIN_SPLIT_LEN`` keys of the longest possible sequence.

    A function of the batch shape and a length bound only, so a CUDA graph captured for a
    padded batch size replays with the same grid whatever the sequences' lengths."""
    want = triton.cdiv(_TARGET_PROGRAMS, max(1, num_tokens * kv_heads))
    cap = triton.cdiv(max(1, max_seq_len), _MIN_SPLIT_LEN)
    return min(_MAX_SPLITS, triton.next_power_of_2(min(want, cap)))


def _precision(dtype: torch.dtype) -> str:
    # float32 runs must be float32 (greedy parity with transformers); tf32 would round.
    return "ieee" if dtype == torch.float32 else "tf32"


@dataclass(frozen=True)
class DecodeLaunch:
    """The split-K decode kernel's launch parameters. ``splits`` 0: ``num_decode_splits``;
    ``num_stages`` 0: ``decode_stages``."""

    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 0
    splits: int = 0


# Programs from which a decode launch over heads of at most 64 takes two pipeline stages, not
# three (``decode_stages``).
_TWO_STAGE_PROGRAMS = 2048


def decode_stages(head_dim: int, programs: int) -> int:
    """Pipeline stages of the decode kernel's key loop: two for heads of at most 64 in a launch
    of ``_TWO_STAGE_PROGRAMS`` programs or more, else three. Measured on an H100 host
    (docs/benchmarks.md, thirty-fourth session): Llama 3.2 1B's decode step (8 KV heads of 64) at
    256 rows and 1,024 keys, one split (2,048 programs), 4.20 / 4.21 ms against 4.59 / 4.59 with
    three; decode runs at 256 rows 4.2% faster, at 512 0.5%, and at 64 rows (512 programs) 1.5%
    slower with two. Gemma 3 270M's heads of 256 are faster with three (1.79 against 1.89 ms).
    A block of keys takes less shared memory with two stages, so more programs share an SM."""
    return 2 if head_dim <= 64 and programs >= _TWO_STAGE_PROGRAMS else 3


# The splits' merge: "inline" (the last program of each (token, KV head) merges, counted on
# ``_arrivals``) or "kernel" (a second kernel, ``_decode_merge_kernel``); ``ASERVE_DECODE_MERGE``.
# Inline saved 1.9% of the Gemma 3 270M shape's decode step at 256 rows on an H200 (its 18 merge
# kernels took 51 us a step; docs/benchmarks.md, thirty-third session).
DECODE_MERGE = os.environ.get("ASERVE_DECODE_MERGE", "inline")
if DECODE_MERGE not in ("kernel", "inline"):
    raise ValueError(f"ASERVE_DECODE_MERGE={DECODE_MERGE!r}: 'kernel' or 'inline'")
_ARRIVALS: dict[tuple[torch.device, int, int], torch.Tensor] = {}


def _arrivals(device: torch.device, n: int) -> torch.Tensor | None:
    """``n`` zeroed int32 counters for the inline merge, kept per (device, stream, size): each
    launch leaves them at zero (the merging program resets its own), so one tensor serves every
    launch of that size on that stream (launches on one stream never overlap, a CUDA graph's
    replays included; two engines' streams get their own). None while a CUDA graph is being
    captured and they do not exist yet: made there, they would live in the graph's memory pool
    and be zeroed only by its replays (the caller merges with the kernel instead; the decode
    graphs warm each size up before capturing it)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    c = _ARRIVALS.get((device, stream, n))
    if c is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        c = _ARRIVALS[(device, stream, n)] = torch.zeros(n, dtype=torch.int32, device=device)
    return c


def _decode_launch_from_env() -> DecodeLaunch:
    spec = os.environ.get("ASERVE_DECODE_LAUNCH")
    if not spec:
        return DecodeLaunch()
    block_n, num_warps, num_stages, *splits = (int(x) for x in spec.split(","))
    if len(splits) > 1 or (splits and splits[0] & (splits[0] - 1)):
        raise ValueError(f"ASERVE_DECODE_LAUNCH={spec!r}: block_n,num_warps,num_stages[,splits], splits a power of two")
    return DecodeLaunch(block_n=block_n, num_warps=num_warps, num_stages=num_stages, splits=splits[0] if splits else 0)


# The decode kernel's launch parameters: DecodeLaunch's defaults, or ``ASERVE_DECODE_LAUNCH`` =
# ``block_n,num_warps,num_stages[,splits]`` (for benchmarks; read at import; num_stages 0:
# ``decode_stages``). A sweep at batch 256,
# context 1024 on an H200 (``python -m aserve.bench.decode_kernels``) put 64 keys a block with
# two stages 10% ahead for Llama 3.2 1B's 64-wide heads in isolation; in the whole decode step
# (graph replays, the same call) it was on par there (4.26 against 4.29 / 4.30 ms) and far
# behind on Gemma 3 270M's 256-wide heads (2.25 against 1.64 / 1.65 ms): the defaults stay.
DECODE_LAUNCH = _decode_launch_from_env()


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor, rows: torch.Tensor,
            seq_lens: torch.Tensor, bound: int, scale: float, window: int | None,
            out: torch.Tensor, launch: DecodeLaunch | None = None) -> torch.Tensor:  # fmt: skip
    """Single-token queries: q[b] (b < len(rows)) attends to the first ``seq_lens[b]`` keys of
    table row ``rows[b]`` (0: none, a zero output) and is written to ``out[b]``. ``bound``: the
    longest any sequence may be (the split count follows it, so a graph's grid is fixed)."""
    _t, h, d = q.shape
    t = rows.shape[0]
    hkv = k_cache.shape[1]
    group = h // hkv
    cfg = launch or DECODE_LAUNCH
    splits = cfg.splits or num_decode_splits(t, hkv, bound)
    # One split: the kernel writes ``out``; more: partial outputs, merged inline or by a second kernel.
    mid_o = torch.empty(t, h, splits, d, dtype=torch.float32, device=q.device) if splits > 1 else out
    mid_lse = torch.empty(t, h, splits, dtype=torch.float32, device=q.device) if splits > 1 else out
    count = _arrivals(q.device, t * hkv) if splits > 1 and DECODE_MERGE == "inline" else None
    inline = count is not None
    _decode_split_kernel[(t, hkv, splits)](
        q, k_cache, v_cache, table, rows, seq_lens, mid_o, mid_lse, out, seq_lens if count is None else count,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        table.stride(0), mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1), scale, window or 0,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=d, BLOCK_N=cfg.block_n, NUM_SPLITS=splits,
        HAS_WINDOW=window is not None, PRECISION=_precision(q.dtype), INLINE_MERGE=inline,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages or decode_stages(d, t * hkv * splits), **launch_args(q),
    )  # fmt: skip
    if splits == 1 or inline:
        return out
    _decode_merge_kernel[(t, h)](
        mid_o, mid_lse, out, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1), NUM_SPLITS=splits, D=d, **launch_args(q),
    )  # fmt: skip
    return out


def extend_block_m(head_dim: int) -> int:
    """Query rows per program of the extend kernel."""
    return 16 if head_dim > 128 else 32


def _extend_grid(
    meta: AttentionMetadata, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Each sequence's first token in q, and each program's (sequence, query block), built on
    the device once per forward (every layer reuses them). The program count comes from the
    host lengths, or is a bound (``meta.token_bound``) on a CUDA graph's fixed-shape step; the
    spare programs get sequence index ``num_seqs`` and return at once.

    In a fixed-shape step the sequences that lead the batch with one token each (a mixed
    step's decodes) are the decode kernel's: they get no query block here, and the fourth
    tensor holds their lengths for it (0 for every other sequence). In the extend kernel one
    program per query head would read a decode's whole context once per head of its group."""
    key = ("triton.extend_grid", block_m)
    grid = meta.cache.get(key)
    if grid is None:
        ext = meta.extend_lens
        q_start = torch.cumsum(ext, 0) - ext
        decode_lens = None
        if meta.token_bound is None:
            num_blocks = sum(triton.cdiv(e, block_m) for e in meta.extend_lens_cpu)
        else:
            num_blocks = triton.cdiv(meta.token_bound, block_m) + ext.shape[0]
            lead = (ext == 1) & (q_start == torch.arange(ext.shape[0], device=ext.device))
            decode_lens = torch.where(lead, meta.seq_lens, 0)
            ext = torch.where(lead, 0, ext)
        blocks = (ext + block_m - 1) // block_m
        ends = torch.cumsum(blocks, 0)
        program = torch.arange(num_blocks, dtype=ends.dtype, device=ext.device)
        seq = torch.searchsorted(ends, program, right=True)  # [num_blocks], num_seqs for spares
        first = (ends - blocks)[seq.clamp(max=ext.shape[0] - 1)]
        grid = meta.cache[key] = (q_start, seq, program - first, decode_lens)
    return grid


def _extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
            scale: float, window: int | None) -> torch.Tensor:  # fmt: skip
    _t, h, d = q.shape
    hkv = k_cache.shape[1]
    # A fixed-shape step's padding tokens belong to no sequence: zeros, not stale memory.
    out = torch.empty_like(q) if meta.token_bound is None else torch.zeros_like(q)
    block_m = extend_block_m(d)
    q_start, block_seq, block_idx, decode_lens = _extend_grid(meta, block_m)
    table = meta.req_to_token
    if decode_lens is not None:
        # Rows [0, num_seqs) of q: the leading decodes get their outputs; the other rows, zeros
        # that the extend kernel below overwrites where they are prompt tokens.
        assert meta.seq_len_bound is not None, "a fixed-shape step bounds its sequences' lengths"
        assert meta.req_pool_indices.shape[0] <= q.shape[0], "the decode kernel's rows are q's first rows"
        _decode(q, k_cache, v_cache, table, meta.req_pool_indices, decode_lens, meta.seq_len_bound, scale, window, out)
    _extend_kernel[(block_seq.shape[0], h)](
        q, k_cache, v_cache, out, table, meta.req_pool_indices, meta.prefix_lens, meta.extend_lens, q_start,
        block_seq, block_idx,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1), table.stride(0),
        scale, window or 0, meta.extend_lens.shape[0],
        GROUP=h // hkv, D=d, BLOCK_M=block_m, BLOCK_N=32, HAS_WINDOW=window is not None,
        PRECISION=_precision(q.dtype),
    )  # fmt: skip
    return out


def paged_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Same contract as ``reference.paged_attention`` (without soft-capping). Returns [T, H, D]."""
    write_kv(k, v, k_cache, v_cache, meta)
    return attend_triton(q, k_cache, v_cache, meta, scale, sliding_window)


def attend_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Attention of q [T, H, D] over the caches, whose new tokens' K/V are already written."""
    assert q.shape[2] in (16, 32, 64, 128, 256), f"head_dim {q.shape[2]} is not supported by the Triton kernels"
    q = q.contiguous()
    if meta.all_decode:
        bound = meta.max_seq_len if meta.seq_len_bound is None else meta.seq_len_bound
        return _decode(q, k_cache, v_cache, meta.req_to_token, meta.req_pool_indices, meta.seq_lens, bound, scale,
                       sliding_window, torch.empty_like(q))  # fmt: skip
    return _extend(q, k_cache, v_cache, meta, scale, sliding_window)

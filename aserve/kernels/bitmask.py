"""Structured outputs on the device: a grammar's allowed-token bitmask applied to the logits in
place, in one pass.

The torch definition (:func:`aserve.sampling.masks.allowed_tokens`, then ``masked_fill`` and
``index_put``) unpacks every row's bitmask to ``[R, V]`` int32 and bool temporaries and copies the
masked rows twice: at 256 rows of a 262k vocabulary that is over 1 GB of device traffic and
several kernels a step. Here each program reads 32 words of one row's mask and the matching
1,024 logits, and writes ``-inf`` where a bit is clear. Bit ``t % 32`` of word ``t // 32``
allows token ``t`` (llguidance's layout). Used on CUDA; the CPU keeps the torch ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_WORDS = 32  # mask words per program: 1,024 tokens


@triton.jit
def _apply_bitmask_kernel(Logits, Rows, Bits, stride_l, stride_b, vocab, WORDS: tl.constexpr):
    r = tl.program_id(0)
    block = tl.program_id(1)
    row = tl.load(Rows + r).to(tl.int64)
    words = block * WORDS + tl.arange(0, WORDS)
    nwords = (vocab + 31) // 32
    bits = tl.load(Bits + r.to(tl.int64) * stride_b + words, mask=words < nwords, other=-1)
    shifts = tl.arange(0, 32)
    allowed = ((bits[:, None] >> shifts[None, :]) & 1) != 0  # [WORDS, 32]
    tokens = words[:, None] * 32 + shifts[None, :]
    ptrs = Logits + row * stride_l + tokens
    # Only disallowed positions are written: a row the grammar leaves open costs one read.
    tl.store(ptrs, tl.full((WORDS, 32), float("-inf"), tl.float32).to(Logits.dtype.element_ty),
             mask=(tokens < vocab) & ~allowed)  # fmt: skip


def apply_bitmask_(logits: torch.Tensor, rows: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """In place: ``logits[rows[i], t] = -inf`` wherever bit ``t`` of ``bits[i]`` is clear.

    logits: [B, V] (last dim contiguous); rows: [R] int64; bits: [R, ceil(V / 32)] int32, all on
    one CUDA device. No host synchronisation; returns ``logits``."""
    vocab = logits.shape[1]
    if rows.shape[0] == 0:
        return logits
    assert logits.stride(1) == 1 and bits.stride(1) == 1
    grid = (rows.shape[0], triton.cdiv(triton.cdiv(vocab, 32), _WORDS))
    _apply_bitmask_kernel[grid](logits, rows, bits, logits.stride(0), bits.stride(0), vocab, WORDS=_WORDS)
    return logits


_ARGMAX_WORDS = 256  # mask words per program of the masked argmax: 8,192 tokens


@triton.jit
def _masked_argmax_partial(Logits, Rows, Bits, PMax, PIdx, stride_l, stride_b, vocab, nblocks,
                           WORDS: tl.constexpr):  # fmt: skip
    r = tl.program_id(0)
    block = tl.program_id(1)
    row = tl.load(Rows + r).to(tl.int64)
    words = block * WORDS + tl.arange(0, WORDS)
    nwords = (vocab + 31) // 32
    bits = tl.load(Bits + r.to(tl.int64) * stride_b + words, mask=words < nwords, other=0)
    shifts = tl.arange(0, 32)
    allowed = ((bits[:, None] >> shifts[None, :]) & 1) != 0  # [WORDS, 32]
    tokens = words[:, None] * 32 + shifts[None, :]
    keep = allowed & (tokens < vocab)
    # A disallowed token's logit is never read: a row the grammar narrows to a few tokens
    # costs its mask and the sectors holding those few.
    x = tl.load(Logits + row * stride_l + tokens, mask=keep, other=float("-inf")).to(tl.float32)
    best = tl.max(tl.max(x, axis=1), axis=0)
    # The first of equal maxima, as torch.argmax: the least token holding the maximum (found
    # by a min over [WORDS, 32], not an argmax over a reshaped block, whose ties the H100 broke
    # otherwise than the interpreter did).
    big = tl.full((WORDS, 32), 2**62, tl.int64)
    at = tl.min(tl.min(tl.where(x == best, tokens.to(tl.int64), big), axis=1), axis=0)
    tl.store(PMax + r * nblocks + block, best)
    tl.store(PIdx + r * nblocks + block, at)


@triton.jit
def _masked_argmax_final(PMax, PIdx, Rows, Out, nblocks, NB: tl.constexpr):
    r = tl.program_id(0)
    blocks = tl.arange(0, NB)
    inside = blocks < nblocks
    m = tl.load(PMax + r * nblocks + blocks, mask=inside, other=float("-inf"))
    idx = tl.load(PIdx + r * nblocks + blocks, mask=inside, other=0)
    best = tl.max(m, axis=0)
    # The lowest token among the blocks holding the maximum (blocks run in token order). A row
    # whose grammar allows nothing is all -inf and gets token 0, as torch.argmax gives.
    big = tl.full((NB,), 2**62, tl.int64)
    tok = tl.min(tl.where(inside & (m == best), idx, big), axis=0)
    tl.store(Out + tl.load(Rows + r).to(tl.int64), tok)


def masked_argmax_(out: torch.Tensor, logits: torch.Tensor, rows: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``out[rows[i]] = argmax`` of ``logits[rows[i]]`` over the tokens ``bits[i]`` allows (the
    first of equal maxima, as ``torch.argmax``); other entries of ``out`` are left alone.

    The same tokens as :func:`apply_bitmask_` then ``argmax``, without writing the logits: two
    small kernels that read each row's mask and only the allowed tokens' logits. out: [B] int64;
    logits: [B, V] (last dim contiguous); rows: [R] int64; bits: [R, ceil(V / 32)] int32; one
    CUDA device, no host synchronisation. Returns ``out``."""
    vocab = logits.shape[1]
    r = rows.shape[0]
    if r == 0:
        return out
    assert logits.stride(1) == 1 and bits.stride(1) == 1 and out.dtype == torch.int64
    nblocks = triton.cdiv(triton.cdiv(vocab, 32), _ARGMAX_WORDS)
    pmax = torch.empty((r, nblocks), dtype=torch.float32, device=logits.device)
    pidx = torch.empty((r, nblocks), dtype=torch.int64, device=logits.device)
    _masked_argmax_partial[(r, nblocks)](logits, rows, bits, pmax, pidx, logits.stride(0), bits.stride(0), vocab,
                                         nblocks, WORDS=_ARGMAX_WORDS)  # fmt: skip
    _masked_argmax_final[(r,)](pmax, pidx, rows, out, nblocks, NB=max(2, triton.next_power_of_2(nblocks)))
    return out

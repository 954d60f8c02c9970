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

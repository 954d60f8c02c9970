"""Structured outputs on the device: a grammar's allowed-token bitmask applied to the logits in
place, in one pass.

The torch definition (:func:`aserve.sampling.masks.allowed_tokens`, then ``masked_fill`` and
``index_put``) unpacks every row's bitmask to ``[R, V]`` int32 and bool temporaries and copies the
masked rows twice: at 256 rows of a 262k vocabulary that is over 1 GB of device traffic and
several kernels a step. Here each program reads 32 words of one row's mask and the matching
1,024 logits, and writes ``-inf`` where a bit is clear. Bit ``t % 32`` of word ``t // 32``
allows token ``t`` (llguidance's layout). Used on CUDA; the CPU keeps the torch ops.

A greedy constrained step needs only each row's argmax over its allowed tokens:
:func:`masked_argmax_` takes it in one launch without writing the logits, and can publish the
tokens into the FutureMap itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from aserve.kernels.pdl import launch_args, wait_for_prior

if TYPE_CHECKING:
    from aserve.sampling.fsm import DeviceAutomaton

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


_ARGMAX_WORDS = 64  # mask words a program reads an iteration of the masked argmax: 2,048 tokens
_NO_KEY = -1  # a row's combined key before any of its programs reported (every real key is >= 0)


# Arguments that vary from launch to launch without changing the code: no recompile for them
# (a device path's first launch at a new batch size or automaton would otherwise compile).
@triton.jit(do_not_specialize=["nsplit", "n_keys", "stride_auto"],
            do_not_specialize_on_alignment=["Rows", "Start", "StateRows"])  # fmt: skip
def _masked_argmax_kernel(Logits, Rows, Bits, Out, Keys, Count, FmTokens, FmRows, MaskOf, Start, States, StateRows,
                          AutoKeys, AutoAfter, stride_l, stride_b, vocab, words_per_program, nsplit, n_keys,
                          stride_auto, PUBLISH: tl.constexpr, AUTOMATON: tl.constexpr, MASKED: tl.constexpr,
                          WORDS: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    wait_for_prior(PDL)
    r = tl.program_id(0)
    s = tl.program_id(1)
    row = tl.load(Rows + r).to(tl.int64)
    nwords = (vocab + 31) // 32
    first = s * words_per_program
    end = tl.minimum(first + words_per_program, nwords)
    shifts = tl.arange(0, 32)
    lane = tl.arange(0, WORDS)
    if AUTOMATON:
        # The row's automaton state: the host's (Start >= 0) or the one the device holds at its
        # FutureMap row; its mask is a row of the automaton's table (Bits).
        state_at = States + tl.load(StateRows + row)
        state = tl.load(Start + r)
        state = tl.where(state >= 0, state, tl.load(state_at))
        bits_row = Bits + tl.load(MaskOf + state) * stride_b
    else:
        bits_row = Bits + r.to(tl.int64) * stride_b
    logits_row = Logits + row * stride_l
    # Per position of the [WORDS, 32] tile: the largest logit seen there and the first token
    # holding it (tokens rise from one iteration to the next, so a strict > keeps the first).
    best = tl.full((WORDS, 32), float("-inf"), tl.float32)
    at = tl.zeros((WORDS, 32), tl.int32)
    for w0 in range(first, end, WORDS):
        words = w0 + lane
        tokens = words[:, None] * 32 + shifts[None, :]
        if MASKED:
            bits = tl.load(bits_row + words, mask=words < end, other=0)
            keep = (((bits[:, None] >> shifts[None, :]) & 1) != 0) & (tokens < vocab)
        else:
            keep = (words[:, None] < end) & (tokens < vocab)
        # A disallowed token's logit is never read: a row the grammar narrows to a few tokens
        # costs its mask and the sectors holding those few.
        x = tl.load(logits_row + tokens, mask=keep, other=float("-inf")).to(tl.float32)
        take = x > best
        best = tl.where(take, x, best)
        at = tl.where(take, tokens, at)
    # This program's maximum and the least token holding it (a min over the tile, not an argmax
    # over a reshaped one, whose ties the H100 broke otherwise than the interpreter did). A
    # program that saw no allowed token reports -inf at token 0, which loses to any finite
    # maximum; a row with none at all gets token 0, as torch.argmax of an all -inf row.
    m = tl.max(tl.max(best, axis=1), axis=0)
    tok = tl.min(tl.min(tl.where(best == m, at, 2**31 - 1), axis=1), axis=0)
    m = tl.where(m == 0.0, 0.0, m)  # -0.0 and +0.0 are one value to argmax
    # The programs of a row meet in one int64 key a row: the maximum's bits made to sort as
    # the float does, then the token reversed (the lesser token wins a tie). The last program
    # to report reads the row's key, resets the scratch for the next launch and writes the token.
    b = m.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    ordered = tl.where(b < 0x80000000, b | 0x80000000, 0xFFFFFFFF - b)
    tl.atomic_max(Keys + r, (ordered << 31) | (0x7FFFFFFF - tok.to(tl.int64)))
    if tl.atomic_add(Count + r, 1) == nsplit - 1:
        key = tl.atomic_xchg(Keys + r, -1)  # _NO_KEY
        tl.atomic_xchg(Count + r, 0)
        token = 0x7FFFFFFF - (key & 0x7FFFFFFF)
        tl.store(Out + row, token)
        if PUBLISH:
            tl.store(FmTokens + tl.load(FmRows + row), token)
        if AUTOMATON:
            # The state the token leads to: after[k], k the number of keys at most
            # state * stride + token (DeviceAutomaton.step's searchsorted, as a binary search).
            query = state * stride_auto + token
            lo = state * 0  # int64 scalars
            hi = lo + n_keys
            while lo < hi:
                mid = (lo + hi) // 2
                below = tl.load(AutoKeys + mid) <= query
                lo = tl.where(below, mid + 1, lo)
                hi = tl.where(below, hi, mid)
            tl.store(state_at, tl.load(AutoAfter + lo))


class _Scratch:
    """Each row's key and count of reporting programs, per (device, stream): the kernel leaves
    them as it found them (-1, 0), so a launch needs no clearing kernel; launches on one
    stream run one after another, on two streams they must not share."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        key = (device.index or 0, 0 if stream is None else stream.stream_id)
        bufs = self._bufs.get(key)
        if bufs is None or bufs[0].shape[0] < rows:
            bufs = argmax_scratch(max(rows, 256), device)
            self._bufs[key] = bufs
        return bufs


_SCRATCH = _Scratch()


def argmax_scratch(rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A masked argmax's scratch for up to ``rows`` rows, as the kernel leaves it between launches."""
    return (torch.full((rows,), _NO_KEY, dtype=torch.int64, device=device),
            torch.zeros(rows, dtype=torch.int32, device=device))  # fmt: skip


def masked_argmax_(
    out: torch.Tensor,
    logits: torch.Tensor,
    rows: torch.Tensor,
    bits: torch.Tensor,
    publish: tuple[torch.Tensor, torch.Tensor] | None = None,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``out[rows[i]] = argmax`` of ``logits[rows[i]]`` over the tokens ``bits[i]`` allows (the
    first of equal maxima, as ``torch.argmax``); other entries of ``out`` are left alone. With
    ``publish = (tokens, table_rows)`` each such token is also written to
    ``tokens[table_rows[rows[i]]]`` (a FutureMap's mailboxes).

    The same tokens as :func:`apply_bitmask_` then ``argmax``, without writing the logits, in one
    kernel launch: each row's vocabulary is split over a few programs that read its mask and
    only the allowed tokens' logits, and meet in an atomic maximum. out: [B] int64; logits:
    [B, V] (last dim contiguous); rows: [R] int64; bits: [R, ceil(V / 32)] int32; one CUDA
    device, no host synchronisation. ``scratch``: the rows' keys and counts (int64 filled with
    -1, int32 zeros, at least R each; :func:`argmax_scratch`) when a captured graph must own
    its own, else the stream's shared ones. Returns ``out``."""
    return _argmax(out, logits, rows, bits, publish, scratch, None)


def argmax_(
    out: torch.Tensor,
    logits: torch.Tensor,
    rows: torch.Tensor,
    publish: tuple[torch.Tensor, torch.Tensor] | None = None,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """:func:`masked_argmax_` with every token allowed and no mask read: ``out[rows[i]]`` is
    ``logits[rows[i]].argmax()``, each row's vocabulary split over a few programs (torch's
    argmax gives a row one block: 256 rows of a 262k vocabulary read at well under the
    device's bandwidth). Unlike ``torch.argmax``, a NaN logit is never the maximum (the largest
    other one is; a row of NaNs gives token 0), as in the masked argmax. Returns ``out``."""
    return _argmax(out, logits, rows, None, publish, scratch, None)


def automaton_argmax_(
    out: torch.Tensor,
    logits: torch.Tensor,
    rows: torch.Tensor,
    automaton: DeviceAutomaton,
    start: torch.Tensor,
    states: torch.Tensor,
    state_rows: torch.Tensor,
    publish: tuple[torch.Tensor, torch.Tensor] | None = None,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """:func:`masked_argmax_` for rows in one token automaton, whose states stay on the device
    (:mod:`aserve.device.automata`), in the same one launch: row ``rows[i]``'s state is
    ``start[i]``, or where that is -1 ``states[state_rows[rows[i]]]``; its mask is the
    automaton's for that state, and the state the drawn token leads to is written to
    ``states[state_rows[rows[i]]]``. The same as ``automaton.masks_of``, the masked argmax and
    ``automaton.step`` (three launches and more), with no mask written. start: [R] int64;
    states, state_rows: int64 on the same device. Returns ``out``."""
    # Its masks as wide as the logits' (a wider table's rows would be read at the wrong words,
    # a narrower stride would let a token's key cross into the next state's).
    assert automaton.masks.shape[1] == triton.cdiv(logits.shape[1], 32) <= automaton.stride // 32
    return _argmax(out, logits, rows, automaton.masks, publish, scratch, (automaton, start, states, state_rows))


def _argmax(
    out: torch.Tensor,
    logits: torch.Tensor,
    rows: torch.Tensor,
    bits: torch.Tensor | None,
    publish: tuple[torch.Tensor, torch.Tensor] | None,
    scratch: tuple[torch.Tensor, torch.Tensor] | None,
    automaton: tuple[DeviceAutomaton, torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    vocab = logits.shape[1]
    r = rows.shape[0]
    if r == 0:
        return out
    masked = bits is not None
    assert logits.stride(1) == 1 and (bits is None or bits.stride(1) == 1) and out.dtype == torch.int64
    nwords = triton.cdiv(vocab, 32)
    # Enough programs to keep the device's memory busy at a few rows (~512 in all), no more
    # than one per iteration's worth of words.
    nsplit = max(1, min(512 // r, triton.cdiv(nwords, _ARGMAX_WORDS)))
    per = triton.cdiv(triton.cdiv(nwords, nsplit), _ARGMAX_WORDS) * _ARGMAX_WORDS
    nsplit = triton.cdiv(nwords, per)
    keys, count = _SCRATCH.get(logits.device, r) if scratch is None else scratch
    bits = bits if bits is not None else count.view(1, -1)  # int32, not read (its stride passed as 0)
    fm_tokens, fm_rows = publish if publish is not None else (out, rows)
    if automaton is None:
        tables = (out, rows, out, rows, out, out)  # not read
        n_keys = stride = 0
    else:
        a, start, states, state_rows = automaton
        tables = (a.mask_of, start, states, state_rows, a.keys, a.after)
        n_keys, stride = a.keys.shape[0], a.stride
    _masked_argmax_kernel[(r, nsplit)](logits, rows, bits, out, keys, count, fm_tokens, fm_rows, *tables,
                                       logits.stride(0), bits.stride(0) if masked else 0, vocab, per, nsplit, n_keys,
                                       stride,
                                       PUBLISH=publish is not None, AUTOMATON=automaton is not None,
                                       MASKED=masked, WORDS=_ARGMAX_WORDS, **launch_args(logits))  # fmt: skip
    return out

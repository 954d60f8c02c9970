"""aserve's CPU kernel on GGUF blocks vs gguf-py's own dequantize + a float64 matmul.

The reference is gguf-py (the llama.cpp project's Python package), independent of our C:
the kernel's dequantized rows must equal gguf-py's bit for bit, and its matmul (float32
activations, float32 accumulation) must match float64 to float32 rounding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aserve.kernels import gguf_linear as gl
from aserve.models.loader import resolve_model_path

pytestmark = pytest.mark.skipif(gl.kernel() is None, reason=f"GGUF CPU kernel not built: {gl.unavailable_reason()}")

# One tensor of each type the default model holds (see the module docstring of gguf_linear).
REAL = {
    "Q5_0": "blk.0.attn_q.weight",
    "Q8_0": "blk.0.attn_v.weight",
    "Q4_K": "blk.0.attn_output.weight",
    "Q6_K": "blk.0.ffn_down.weight",
}


@pytest.fixture(scope="module")
def real_tensors() -> dict[str, tuple[torch.Tensor, int, np.ndarray]]:
    """type name -> (blocks [rows, row_bytes] uint8, in_features, gguf-py's float32 weight)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(Path(resolve_model_path("gemma-3-270m")))
    by_name = {t.name: t for t in reader.tensors}
    out = {}
    for qname, tname in REAL.items():
        t = by_name[tname]
        assert t.tensor_type.name == qname, (tname, t.tensor_type.name)
        ref = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        out[qname] = (torch.from_numpy(np.array(t.data)), ref.shape[1], ref)
    return out


def _random_blocks(qname: str, rows: int, in_features: int, seed: int) -> torch.Tensor:
    """Random bytes in the type's layout, with every f16 scale set to a finite value (some of
    them subnormal), so all bit patterns of the quants and the 6-bit scale fields occur."""
    qtype = gl.QTYPES[qname]
    rb = gl.row_bytes(qtype, in_features)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, rb), dtype=np.uint8)
    block, size, f16_at = {"Q8_0": (32, 34, (0,)), "Q5_0": (32, 22, (0,)), "Q4_K": (256, 144, (0, 2)),
                           "Q6_K": (256, 210, (208,))}[qname]  # fmt: skip
    nblocks = in_features // block
    blocks = raw.reshape(rows, nblocks, size)
    for off in f16_at:
        scales = rng.uniform(-0.05, 0.05, size=(rows, nblocks)).astype(np.float16)
        scales.reshape(-1)[::7] = np.float16(3e-6)  # a subnormal half
        blocks[:, :, off : off + 2] = scales.view(np.uint8).reshape(rows, nblocks, 2)
    return torch.from_numpy(blocks.reshape(rows, rb).copy())


def _reference(blocks: torch.Tensor, qname: str) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return np.asarray(dequantize(blocks.numpy(), GGMLQuantizationType[qname]), dtype=np.float32)


def _as_run(blocks: torch.Tensor, qname: str, k: int, layout: str) -> tuple[torch.Tensor, int]:
    """(blocks, qtype) in ``layout``: "gguf" as the file stores them, "repacked" as GGUFLinear
    runs a layer's projection (the kernel's own layout for every type here)."""
    qtype = gl.QTYPES[qname]
    if layout == "repacked" and qtype in gl.REPACKED:
        return gl.repack(blocks, qtype, k)
    return blocks, qtype


LAYOUTS = ["gguf", "repacked"]


def _check_matmul(blocks: torch.Tensor, qtype: int, k: int, ref: np.ndarray, m: int, seed: int) -> None:
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    got = gl.gguf_matmul(x, blocks, qtype, k).double()  # [m, rows]
    want = x.double() @ torch.from_numpy(ref).double().t()
    # float32 products summed in float32 (k terms): error ~ sqrt(k) * eps * sum |x w|.
    bound = (x.double().abs() @ torch.from_numpy(ref).double().abs().t()) * 1e-6
    assert got.shape == want.shape
    assert ((got - want).abs() <= bound + 1e-30).all(), (got - want).abs().max().item()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("qname", list(REAL))
@pytest.mark.slow  # reading the GGUF's header (a 262k-entry vocabulary) takes ~30 s on 2 cores
def test_dequantize_matches_gguf_py_bit_for_bit(qname: str, layout: str, real_tensors: dict) -> None:
    blocks, k, ref = real_tensors[qname]
    got = gl.dequantize_rows(*_as_run(blocks, qname, k, layout), k).numpy()
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("qname", list(REAL))
def test_random_blocks_dequantize_exactly(qname: str, layout: str) -> None:
    k = 512
    blocks = _random_blocks(qname, 37, k, seed=1)
    got = gl.dequantize_rows(*_as_run(blocks, qname, k, layout), k).numpy()
    assert np.array_equal(got, _reference(blocks, qname))


@pytest.mark.parametrize("qname", ["Q5_0", "Q8_0", "Q4_K", "Q6_K"])
def test_repacked_layout_sizes_and_linear(qname: str) -> None:
    """GGUFLinear runs the repacked layout, reports the file's type, and multiplies the same."""
    k = 512
    blocks = _random_blocks(qname, 19, k, seed=11)
    lin = gl.GGUFLinear(blocks, gl.QTYPES[qname], k)
    assert lin.gguf_qtype == gl.QTYPES[qname] and lin.qtype == gl.REPACKED[lin.gguf_qtype]
    per_32 = {"Q5_0": 36, "Q8_0": 36, "Q4_K": 24, "Q6_K": 40}[qname]  # bytes per 32 weights, repacked
    assert lin.blocks.shape == (19, k // 32 * per_32)
    assert "repacked" in repr(lin)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        got = lin(x).double()
    ref = torch.from_numpy(_reference(blocks, qname)).double()
    bound = (x.double().abs() @ ref.abs().t()) * 1e-6
    assert ((got - x.double() @ ref.t()).abs() <= bound + 1e-30).all()


def test_repack_rejects_a_type_without_a_layout() -> None:
    k = gl.kernel()
    assert k is not None
    blocks = _random_blocks("Q8_0", 2, 64, seed=1)
    for qtype in (2, gl.REPACKED[gl.QTYPES["Q5_0"]]):  # Q4_0 (not read at all), an already repacked id
        with pytest.raises(ValueError, match="no repacked layout"):
            k.repack(qtype, blocks.data_ptr(), 2, 64, 0)


# 1 and 5 rows run the kernel (5: one tile of four plus a tail), 40 the dequantize + sgemm path.
@pytest.mark.slow
@pytest.mark.parametrize("m", [1, 5, gl.GEMM_MIN_ROWS + 8])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("qname", list(REAL))
def test_matmul_real_weights(qname: str, layout: str, m: int, real_tensors: dict) -> None:
    blocks, k, ref = real_tensors[qname]
    _check_matmul(*_as_run(blocks, qname, k, layout), k, ref, m, seed=m)


# 1-6 rows take the fused copies for the repacked layouts on AVX-512 (GEMV_MAX_ROWS), 7 the tiles.
@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 7, gl.GEMM_MIN_ROWS + 8])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("qname", list(REAL))
def test_matmul_random_blocks(qname: str, layout: str, m: int) -> None:
    # 37 output rows: not a multiple of the kernel's chunk of 16 or of the thread count.
    k = 768 if qname in ("Q4_K", "Q6_K") else 96
    blocks = _random_blocks(qname, 37, k, seed=2)
    _check_matmul(*_as_run(blocks, qname, k, layout), k, _reference(blocks, qname), m, seed=m)


@pytest.mark.parametrize("m", [1, 4, 6])
@pytest.mark.parametrize("qname", ["Q5_0", "Q8_0", "Q4_K", "Q6_K"])
def test_fused_and_dequantize_then_dot_agree(qname: str, m: int) -> None:
    """The few-row fused copies (repacked layouts) against the dequantize-then-dot path on the
    same machine: equal to float32 rounding, and, on AVX-512, not the same bits (the fused
    copy sums in another order, so this shows it ran)."""
    k = gl.kernel()
    assert k is not None
    in_features = 1024 if qname in ("Q4_K", "Q6_K") else 640
    raw = _random_blocks(qname, 53, in_features, seed=8)
    blocks, qtype = _as_run(raw, qname, in_features, "repacked")
    x = torch.randn(m, in_features, generator=torch.Generator().manual_seed(9))
    prev = k.set_gemv(True)
    try:
        fused = gl.gguf_matmul(x, blocks, qtype, in_features)
        k.set_gemv(False)
        plain = gl.gguf_matmul(x, blocks, qtype, in_features)
    finally:
        k.set_gemv(prev)
    ref = torch.from_numpy(_reference(raw, qname)).double()
    bound = (x.double().abs() @ ref.abs().t()) * 1e-6
    assert ((fused.double() - plain.double()).abs() <= bound + 1e-30).all()
    if k.isa() == "avx512":
        assert not torch.equal(fused, plain)


@pytest.mark.slow  # reading the GGUF's header (a 262k-entry vocabulary) takes ~30 s on 2 cores
def test_threads_do_not_change_the_result(real_tensors: dict) -> None:
    blocks, k, _ = real_tensors["Q5_0"]
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gl.gguf_matmul(x, blocks, gl.QTYPES["Q5_0"], k)
        torch.set_num_threads(2)
        two = gl.gguf_matmul(x, blocks, gl.QTYPES["Q5_0"], k)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)  # each output is one thread's dot product, in the same order


@pytest.mark.slow  # reading the GGUF's header (a 262k-entry vocabulary) takes ~30 s on 2 cores
def test_embedding_and_tied_head(real_tensors: dict) -> None:
    blocks, k, ref = real_tensors["Q8_0"]
    emb = gl.GGUFEmbedding(blocks, gl.QTYPES["Q8_0"], k)
    ids = torch.tensor([[3, 0], [255, 3]])
    assert torch.equal(emb(ids), torch.from_numpy(ref)[ids])
    x = torch.randn(2, k)
    want = x.double() @ torch.from_numpy(ref).double().t()
    assert torch.allclose(emb.logits(x).double(), want, rtol=0, atol=1e-4)
    with pytest.raises(IndexError, match="out of range"):
        emb(torch.tensor([256]))


def test_unsupported_type_and_bad_row_length() -> None:
    with pytest.raises(ValueError, match="unsupported GGML type"):
        gl.row_bytes(2, 64)  # Q4_0
    with pytest.raises(ValueError, match="multiple of the block size"):
        gl.row_bytes(gl.QTYPES["Q4_K"], 640)


@pytest.fixture
def isa_copies() -> list[str]:
    """Every instruction set's copy this CPU runs (AVX-512, AVX2, baseline: users' CPUs may
    lack AVX-512); the kernel's own choice is restored afterwards."""
    k = gl.kernel()
    assert k is not None
    best = k.isa()
    names = ["avx512", "avx2", "baseline"]
    yield names[names.index(best) :]
    k.set_isa(best)


@pytest.mark.parametrize("qname", list(REAL))
def test_every_instruction_set_copy(qname: str, isa_copies: list[str]) -> None:
    k = gl.kernel()
    assert k is not None
    in_features = 512
    raw = _random_blocks(qname, 21, in_features, seed=5)
    ref = _reference(raw, qname)
    for isa in isa_copies:
        k.set_isa(isa)
        for layout in LAYOUTS:
            blocks, qtype = _as_run(raw, qname, in_features, layout)
            assert np.array_equal(gl.dequantize_rows(blocks, qtype, in_features).numpy(), ref), (isa, layout)
            for m in (1, 6):
                _check_matmul(blocks, qtype, in_features, ref, m, seed=6)


def test_set_isa_rejects_an_unknown_name() -> None:
    k = gl.kernel()
    assert k is not None
    with pytest.raises(ValueError, match="not one this CPU runs"):
        k.set_isa("sse9")


def test_linear_with_bias() -> None:
    """Qwen2's q/k/v projections carry a bias; the module adds it after the kernel's matmul."""
    k = 96
    blocks = _random_blocks("Q8_0", 10, k, seed=7)
    lin = gl.GGUFLinear(blocks, gl.QTYPES["Q8_0"], k, bias=True)
    bias = torch.randn(10)
    lin.load_state_dict({"bias": bias})
    x = torch.randn(3, k)
    want = x.double() @ torch.from_numpy(_reference(blocks, "Q8_0")).double().t() + bias.double()
    assert torch.allclose(lin(x).double(), want, rtol=0, atol=1e-4)


def _matmul_threads(x: torch.Tensor, blocks: torch.Tensor, qtype: int, k: int, threads: int) -> torch.Tensor:
    y = torch.empty(x.shape[0], blocks.shape[0])
    gl.kernel().matmul(qtype, blocks.data_ptr(), blocks.shape[0], k, x.data_ptr(), x.shape[0], y.data_ptr(), threads)  # type: ignore[union-attr]
    return y


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_thread_pool_gives_the_one_thread_result(threads: int) -> None:
    # The kernel's own pool (helpers claim chunks of 16 rows; more helpers than cores here):
    # every output is still one thread's dot product in the same order, so equal bit for bit.
    k, qtype = 256, gl.QTYPES["Q4_K"]
    blocks = _random_blocks("Q4_K", 1000, k, seed=5)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(5))
    one = _matmul_threads(x, blocks, qtype, k, 1)
    for _ in range(50):  # many calls in a row: each is a new generation of the pool's ticket
        assert torch.equal(_matmul_threads(x, blocks, qtype, k, threads), one)
    rows = torch.randint(0, 1000, (300,), generator=torch.Generator().manual_seed(6))
    out = torch.empty(300, k)
    gl.kernel().dequantize(qtype, blocks.data_ptr(), k, rows.data_ptr(), 300, out.data_ptr(), threads)  # type: ignore[union-attr]
    assert torch.equal(out, torch.from_numpy(_reference(blocks, "Q4_K"))[rows])


def test_thread_pool_callers_on_several_python_threads() -> None:
    # The kernel releases the GIL: a second caller while the pool runs a call computes alone.
    from concurrent.futures import ThreadPoolExecutor

    k, qtype = 96, gl.QTYPES["Q8_0"]
    blocks = _random_blocks("Q8_0", 4000, k, seed=7)
    xs = [torch.randn(2, k, generator=torch.Generator().manual_seed(s)) for s in range(8)]
    want = [_matmul_threads(x, blocks, qtype, k, 1) for x in xs]
    with ThreadPoolExecutor(4) as ex:
        for _ in range(5):
            got = list(ex.map(lambda x: _matmul_threads(x, blocks, qtype, k, 2), xs))
            assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_thread_pool_after_fork() -> None:
    # A forked child has none of the parent's helper threads; its first call starts its own.
    import multiprocessing as mp

    k, qtype = 96, gl.QTYPES["Q5_0"]
    blocks = _random_blocks("Q5_0", 500, k, seed=8)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(8))
    want = _matmul_threads(x, blocks, qtype, k, 1)
    assert torch.equal(_matmul_threads(x, blocks, qtype, k, 2), want)  # the parent's pool is up
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply(_matmul_threads, (x, blocks, qtype, k, 2))
    assert torch.equal(got, want)


@pytest.mark.parametrize("qname", list(REAL))
def test_prefill_matmul_in_bfloat16(qname: str) -> None:
    """``gemm_bf16``: x and W rounded to bfloat16, the products summed in float32 and the
    result rounded to bfloat16 (torch's CPU bfloat16 matmul): within one bfloat16 step of the
    float64 product of the rounded operands (gguf-py's weights), and exactly the float32 kernel
    below GEMM_MIN_ROWS rows."""
    in_features = 512
    raw = _random_blocks(qname, 40, in_features, seed=11)
    blocks, qtype = _as_run(raw, qname, in_features, "repacked")
    ref = _reference(raw, qname).astype(np.float64)
    x = torch.randn(gl.GEMM_MIN_ROWS + 3, in_features, generator=torch.Generator().manual_seed(11))
    y = gl.gguf_matmul(x, blocks, qtype, in_features, gemm_bf16=True).double().numpy()
    xb = x.to(torch.bfloat16).double().numpy()
    wb = torch.from_numpy(ref).to(torch.bfloat16).double().numpy()
    want = xb @ wb.T
    np.testing.assert_allclose(y, want, rtol=2.0**-7, atol=1e-4 * np.abs(want).max())
    assert not np.allclose(y, x.double().numpy() @ ref.T, rtol=1e-6, atol=0)  # it did round
    few = x[: gl.GEMM_MIN_ROWS - 1]  # fewer rows: float32 here (decode steps: cpu_ops.decoder_stack)
    assert torch.equal(gl.gguf_matmul(few, blocks, qtype, in_features, gemm_bf16=True),
                       gl.gguf_matmul(few, blocks, qtype, in_features))  # fmt: skip


@pytest.mark.skipif(gl.kernel() is None or not gl.kernel().has_bf16(), reason="the CPU has no AVX-512 BF16")
@pytest.mark.parametrize("m", [7, 16, gl.GEMM_MIN_ROWS - 1])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("qname", list(REAL))
def test_batched_decode_matmul_in_bfloat16_tiles(qname: str, layout: str, m: int) -> None:
    """7 to 31 rows with the kernel's bf16 flag (what decoder_stack asks for on a decode step
    of 7+ streams): the bfloat16 tiles. Independent reference: torch rounds x and gguf-py's
    weights to bfloat16, float64 multiplies them; the tiles sum in float32, so they agree to
    float32 rounding of the sum (not bfloat16's), and the result differs from the float32
    kernel's (it did round). 37 output rows: a tail of one weight row. Up to 6 rows the flag
    is ignored (the fused float32 copies)."""
    in_features = 768 if qname in ("Q4_K", "Q6_K") else 640
    raw = _random_blocks(qname, 37, in_features, seed=13)
    blocks, qtype = _as_run(raw, qname, in_features, layout)
    ref = torch.from_numpy(_reference(raw, qname)).double()
    x = torch.randn(m, in_features, generator=torch.Generator().manual_seed(m))

    def kernel(rows: torch.Tensor, bf16: int) -> torch.Tensor:
        y = torch.empty(rows.shape[0], 37)
        gl._k().matmul(qtype, blocks.data_ptr(), 37, in_features, rows.data_ptr(), rows.shape[0], y.data_ptr(), 2, bf16)
        return y

    got = kernel(x, 1).double()
    xb, wb = x.to(torch.bfloat16).double(), ref.to(torch.bfloat16).double()
    bound = (xb.abs() @ wb.abs().t()) * 1e-6
    assert ((got - xb @ wb.t()).abs() <= bound + 1e-30).all(), (got - xb @ wb.t()).abs().max().item()
    assert not torch.equal(got.float(), kernel(x, 0))
    assert torch.equal(kernel(x[:6].contiguous(), 1), kernel(x[:6].contiguous(), 0))

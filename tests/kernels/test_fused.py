"""Fused Triton ops vs the eager torch definitions in aserve/models/layers.py.

On a CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from aserve.kernels.fused import gated, rmsnorm, rotary
from aserve.models.layers import RMSNorm, Rotary, apply_rotary

# Triton's CPU interpreter runs these slowly on a CPU (quick set: `pytest`; these: `pytest -m slow`).
pytestmark = pytest.mark.slow

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 256), (1, 640), (7, 100)])
def test_rmsnorm(dtype: torch.dtype, gemma: bool, shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(len(shape) + shape[-1])
    norm = RMSNorm(shape[-1], 1e-6, gemma=gemma).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1], generator=g) * 0.3)
    x = (torch.randn(shape, generator=g) * 3).to(DEVICE, dtype)
    ref = norm(x)
    out = rmsnorm(x, norm.weight, 1e-6, gemma)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "dim"), [(4, 256), (8, 64), (2, 32)])
def test_rotary(dtype: torch.dtype, heads: int, dim: int) -> None:
    g = torch.Generator().manual_seed(heads * dim)
    positions = torch.randint(0, 5000, (9,), generator=g).to(DEVICE)
    cos, sin = Rotary(dim, 10000.0, None).cos_sin(positions, dtype)
    x = torch.randn(9, heads, dim, generator=g).to(DEVICE, dtype)
    torch.testing.assert_close(rotary(x, cos, sin), apply_rotary(x, cos, sin), **_tol(dtype))
    # A strided view (q out of a fused projection) works too.
    wide = torch.randn(9, heads + 1, dim, generator=g).to(DEVICE, dtype)
    view = wide[:, 1:]
    torch.testing.assert_close(rotary(view, cos, sin), apply_rotary(view, cos, sin), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
def test_gated(dtype: torch.dtype, act: str) -> None:
    g = torch.Generator().manual_seed(7)
    gate = (torch.randn(13, 300, generator=g) * 3).to(DEVICE, dtype)
    up = torch.randn(13, 300, generator=g).to(DEVICE, dtype)
    ref = (F.gelu(gate.float(), approximate="tanh") if act == "gelu_tanh" else F.silu(gate.float())) * up.float()
    torch.testing.assert_close(gated(gate, up, act).float(), ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("shape", [(6, 640), (1, 64), (4, 100)])
def test_add_rmsnorm_matches_eager_add_and_norms(dtype: torch.dtype, gemma: bool, shape: tuple[int, int]) -> None:
    """Llama: h = r + x, y = norm(h). Gemma: h = r + post_norm(x), y = pre_norm(h)."""
    from aserve.kernels.fused import add_rmsnorm

    g = torch.Generator().manual_seed(shape[1] + gemma)
    norm = RMSNorm(shape[1], 1e-6, gemma=gemma).to(DEVICE, dtype)
    x_norm = RMSNorm(shape[1], 1e-6, gemma=gemma).to(DEVICE, dtype) if gemma else None
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[1], generator=g) * 0.3)
        if x_norm is not None:
            x_norm.weight.copy_(torch.randn(shape[1], generator=g) * 0.3)
    x = (torch.randn(shape, generator=g) * 3).to(DEVICE, dtype)
    r = (torch.randn(shape, generator=g) * 5).to(DEVICE, dtype)
    h_ref = r + (x if x_norm is None else x_norm(x))
    y_ref = norm(h_ref)
    h, y = add_rmsnorm(x, r, norm.weight, 1e-6, gemma, None if x_norm is None else x_norm.weight)
    assert h.dtype == y.dtype == dtype and h.shape == y.shape == x.shape
    # The residual stream is rounded exactly where the eager ops round it.
    torch.testing.assert_close(h, h_ref, **_tol(dtype))
    torch.testing.assert_close(y, y_ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float16])
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("splits", [2, 3])
def test_add_rmsnorm_sums_split_k_partials(dtype: torch.dtype, gemma: bool, splits: int) -> None:
    """x as a split-K GEMM's float32 partials [S, T, dim] (here strided: rows 648 apart): the
    same (h, y) as x = their sum rounded to the model's dtype."""
    from aserve.kernels.fused import add_rmsnorm

    g = torch.Generator().manual_seed(splits + 10 * gemma)
    t, dim = 5, 640
    w = (torch.randn(dim, generator=g) * 0.3).to(DEVICE, dtype)
    xw = (torch.randn(dim, generator=g) * 0.3).to(DEVICE, dtype) if gemma else None
    parts = (torch.randn(splits, t, dim + 8, generator=g) * 2).to(DEVICE)[..., :dim]
    r = (torch.randn(t, dim, generator=g) * 5).to(DEVICE, dtype)
    x = parts[0].clone()
    for s in range(1, splits):  # the kernel's order of summation
        x += parts[s]
    h_ref, y_ref = add_rmsnorm(x.to(dtype), r, w, 1e-6, gemma, xw)
    h, y = add_rmsnorm(parts, r, w, 1e-6, gemma, xw)
    assert h.dtype == y.dtype == dtype and h.shape == y.shape == (t, dim)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)


def test_add_rmsnorm_writes_every_element(monkeypatch: pytest.MonkeyPatch) -> None:
    import aserve.kernels.fused as fused

    real_empty, real_empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(fused.torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    monkeypatch.setattr(fused.torch, "empty_like", lambda t: real_empty_like(t).fill_(float("nan")))
    x = torch.randn(5, 96).to(DEVICE)
    h, y = fused.add_rmsnorm(x, torch.randn(5, 96).to(DEVICE), torch.ones(96).to(DEVICE), 1e-6, False)
    assert torch.isfinite(h).all() and torch.isfinite(y).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_on_fused_projection_halves(dtype: torch.dtype) -> None:
    """The fused MLP hands the kernel the two column halves of one [T, 2I] GEMM output."""
    g = torch.Generator().manual_seed(8)
    gu = (torch.randn(6, 2 * 200, generator=g) * 3).to(DEVICE, dtype)
    gate, up = gu[:, :200], gu[:, 200:]
    ref = F.gelu(gate.float(), approximate="tanh") * up.float()
    torch.testing.assert_close(gated(gate, up, "gelu_tanh").float(), ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "norm"),
    [(4, 1, 256, True), (8, 2, 64, False), (4, 4, 32, True), (6, 2, 128, False)],
)
@pytest.mark.parametrize("heads_per_program", ["", "1", "4"])  # the default (all), one, a block that splits k/v
@pytest.mark.parametrize("layout", ["token", "head"])
def test_qkv_prep_matches_norm_rotary_and_cache_write(
    dtype: torch.dtype, heads: int, kv_heads: int, dim: int, norm: bool, heads_per_program: str, layout: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """q/k norm + rotary + KV write from one fused projection == the eager modules in turn;
    q is fully written (poisoned output), only the tokens' cache slots change."""
    from aserve.kernels.fused import qkv_prep, qkv_prep_heads

    monkeypatch.setenv("ASERVE_QKV_HEADS", heads_per_program)
    if not heads_per_program:
        assert qkv_prep_heads(heads, kv_heads, dim) >= heads + 2 * kv_heads  # one program a token

    g = torch.Generator().manual_seed(heads * dim + norm)
    t, slots_total = 7, 40
    qkv = (torch.randn(t, (heads + 2 * kv_heads) * dim, generator=g) * 2).to(DEVICE, dtype)
    positions = torch.randint(0, 3000, (t,), generator=g).to(DEVICE)
    slots = torch.randperm(slots_total, generator=g)[:t].to(DEVICE)
    cos, sin = Rotary(dim, 10000.0, None).cos_sin(positions, dtype)
    q_norm = RMSNorm(dim, 1e-6, gemma=True).to(DEVICE, dtype)
    k_norm = RMSNorm(dim, 1e-6, gemma=True).to(DEVICE, dtype)
    with torch.no_grad():
        q_norm.weight.copy_(torch.randn(dim, generator=g) * 0.3)
        k_norm.weight.copy_(torch.randn(dim, generator=g) * 0.3)
    caches = [torch.randn(slots_total, kv_heads, dim, generator=g).to(DEVICE, dtype) for _ in range(4)]
    k_ref, v_ref, k_out, v_out = caches
    if layout == "head":  # the cache's memory [KV heads, slots, D]: the kernel writes through strides
        k_out, v_out = (torch.empty(kv_heads, slots_total, dim, dtype=dtype, device=DEVICE).transpose(0, 1)
                        for _ in range(2))  # fmt: skip
    k_out.copy_(k_ref)
    v_out.copy_(v_ref)

    q, k, v = (u.view(t, -1, dim) for u in qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=1))
    if norm:
        q, k = q_norm(q), k_norm(k)
    q_exp, k_exp = rotary(q, cos, sin), rotary(k, cos, sin)
    k_ref[slots], v_ref[slots] = k_exp, v  # the eager cache write (reference.write_kv)

    import aserve.kernels.fused as fused

    real_empty = torch.empty
    try:
        fused.torch.empty = lambda *a, **k: real_empty(*a, **k).fill_(float("nan"))  # type: ignore[assignment]
        q_out = qkv_prep(
            qkv, heads, kv_heads, dim, q_norm.weight if norm else None, k_norm.weight if norm else None,
            1e-6, True, cos, sin, slots, k_out, v_out,
        )  # fmt: skip
    finally:
        fused.torch.empty = real_empty  # type: ignore[assignment]
    assert q_out.shape == (t, heads, dim) and torch.isfinite(q_out).all()
    torch.testing.assert_close(q_out, q_exp, **_tol(dtype))
    torch.testing.assert_close(k_out[slots], k_ref[slots], **_tol(dtype))
    assert torch.equal(v_out, v_ref)  # v is copied as is
    untouched = torch.ones(slots_total, dtype=torch.bool, device=DEVICE)
    untouched[slots] = False
    assert torch.equal(k_out[untouched], k_ref[untouched])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("head_dim", "base", "scaled"), [(64, 500000.0, True), (256, 10000.0, False), (32, 1e6, False)]
)
def test_cos_sin_matches_torch_ops(dtype: torch.dtype, head_dim: int, base: float, scaled: bool) -> None:
    """The rotary table in one kernel == ``Rotary.cos_sin``'s torch ops, positions up to 131k
    (where an approximate cos would be far off); on a CPU the interpreter's numpy cos and sin
    differ from torch's by an ulp at most before rounding."""
    from aserve.kernels.fused import cos_sin
    from aserve.models.config import RopeScaling

    scaling = RopeScaling("llama3", 32.0, 1.0, 4.0, 8192) if scaled else None
    rope = Rotary(head_dim, base, scaling)
    g = torch.Generator().manual_seed(head_dim)
    positions = torch.cat([torch.arange(40), torch.randint(0, 131072, (60,), generator=g)]).to(DEVICE)
    cos_ref, sin_ref = rope.cos_sin(positions, dtype)
    inv = rope.inv_freq.to(DEVICE)
    cos, sin = cos_sin(positions, inv, dtype)
    assert cos.shape == cos_ref.shape == (100, 1, head_dim) and cos.dtype == dtype
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(cos, cos_ref, rtol=ulp, atol=ulp)
    torch.testing.assert_close(sin, sin_ref, rtol=ulp, atol=ulp)
    rope.fused = True  # the module takes the kernel on a GPU, torch's ops on a CPU
    torch.testing.assert_close(rope.cos_sin(positions, dtype)[0], cos_ref, rtol=ulp, atol=ulp)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
@pytest.mark.parametrize("tokens", [1, 20, 70])  # the three row-block sizes (16, 32, 64)
def test_gate_up_gated_matches_gemm_then_gated(dtype: torch.dtype, act: str, tokens: int) -> None:
    """The gate/up GEMM and the activation in one kernel == ``F.linear`` on the packed weight
    then ``gated`` (a hidden size and an intermediate size that are not multiples of the tiles)."""
    from aserve.kernels.fused import gate_up_gated

    g = torch.Generator().manual_seed(tokens)
    hidden, inter = 96, 100
    x = torch.randn(tokens, hidden, generator=g).to(DEVICE, dtype)
    w = (torch.randn(2 * inter, hidden, generator=g) / hidden**0.5).to(DEVICE, dtype)
    gu = F.linear(x, w)
    ref = gated(gu[:, :inter], gu[:, inter:], act)
    out = gate_up_gated(x, w, act)
    assert out.shape == (tokens, inter) and out.dtype == dtype
    torch.testing.assert_close(out, ref, **_tol(dtype))

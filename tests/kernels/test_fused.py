"""Fused Triton ops vs the eager torch definitions in aserve/models/layers.py.

On a CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from aserve.kernels.fused import gated, rmsnorm, rotary
from aserve.models.layers import RMSNorm, Rotary, apply_rotary

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


def test_add_rmsnorm_writes_every_element(monkeypatch: pytest.MonkeyPatch) -> None:
    import aserve.kernels.fused as fused

    real_empty, real_empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(fused.torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    monkeypatch.setattr(fused.torch, "empty_like", lambda t: real_empty_like(t).fill_(float("nan")))
    x = torch.randn(5, 96).to(DEVICE)
    h, y = fused.add_rmsnorm(x, torch.randn(5, 96).to(DEVICE), torch.ones(96).to(DEVICE), 1e-6, False)
    assert torch.isfinite(h).all() and torch.isfinite(y).all()

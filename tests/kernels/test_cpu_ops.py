"""The C small ops (kernels/cpu_ops.py) against torch's eager modules and a naive attention.

They replace eager ops one for one, so each is checked against the module it stands in for
(float32, to rounding); the attention against the same float64 per-sequence loop the reference
attention is tested with, over the same awkward batch (prefills, decodes, a chunked extend,
grouped heads, sliding windows, soft-capping)."""

from __future__ import annotations

import math

import pytest
import torch

from aserve.attention.metadata import build_metadata
from aserve.attention.reference import paged_attention
from aserve.kernels import cpu_ops
from aserve.models.layers import RMSNorm, add_norm, apply_rotary
from tests.attention.test_reference import _naive

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="aserve's C kernel is not built")


def _norm(dim: int, gemma: bool, seed: int) -> RMSNorm:
    n = RMSNorm(dim, 1e-6, gemma=gemma)
    n.weight.data = torch.randn(dim, generator=torch.Generator().manual_seed(seed)) * (0.1 if gemma else 1.0)
    return n


@pytest.mark.parametrize("gemma", [True, False])
@pytest.mark.parametrize("shape", [(1, 640), (5, 640), (3, 4, 256), (2, 100)])
def test_rmsnorm_matches_the_eager_module(gemma: bool, shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 3
    n = _norm(shape[-1], gemma, 2)
    want = n(x)
    n.fused = True
    got = n(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("sandwich", [True, False])
def test_add_norm_matches_the_eager_pair(sandwich: bool) -> None:
    g = torch.Generator().manual_seed(3)
    x, residual = torch.randn(4, 640, generator=g), torch.randn(4, 640, generator=g) * 5
    norm, x_norm = _norm(640, True, 4), (_norm(640, True, 5) if sandwich else None)
    h_want, y_want = add_norm(x, residual, norm, x_norm)
    norm.fused = True
    h, y = add_norm(x, residual, norm, x_norm)
    torch.testing.assert_close(h, h_want, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(y, y_want, rtol=2e-6, atol=2e-6)


def test_rotary_matches_apply_rotary() -> None:
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 4, 256, generator=g)
    pos = torch.tensor([0.0, 17.0, 8000.0])
    inv = 1.0 / (10000 ** (torch.arange(0, 256, 2).float() / 256))
    emb = torch.cat([pos[:, None] * inv] * 2, dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    got = cpu_ops.rotary(x, cos, sin)
    torch.testing.assert_close(got, apply_rotary(x, cos, sin), rtol=1e-6, atol=1e-6)
    assert not torch.equal(got, x)  # out of place: the input is left alone


@pytest.mark.parametrize(
    ("heads", "kv_heads", "window", "softcap", "seed"),
    [(4, 4, None, None, 0), (8, 2, None, None, 1), (6, 3, 3, None, 2), (4, 1, 5, 20.0, 3), (2, 2, 1, None, 4)],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_matches_naive(
    heads: int, kv_heads: int, window: int | None, softcap: float | None, seed: int, threads: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    dim, rows, max_ctx = 64, 5, 40
    num_slots = rows * max_ctx + 1
    prefix, extend, seq_rows = [0, 7, 12, 3, 0], [9, 1, 1, 6, 1], [3, 0, 4, 1, 2]
    perm = torch.randperm(num_slots - 1, generator=g) + 1
    table = perm[: rows * max_ctx].view(rows, max_ctx).clone()
    k_cache = torch.randn(num_slots, kv_heads, dim, generator=g)
    v_cache = torch.randn(num_slots, kv_heads, dim, generator=g)
    total = sum(extend)
    q, k, v = (torch.randn(total, h, dim, generator=g) for h in (heads, kv_heads, kv_heads))
    keys, vals, t = [], [], 0
    for row, p, e in zip(seq_rows, prefix, extend, strict=True):
        keys.append(torch.cat([k_cache[table[row, :p]], k[t : t + e]]).double())
        vals.append(torch.cat([v_cache[table[row, :p]], v[t : t + e]]).double())
        t += e
    scale = 1 / math.sqrt(dim)
    want = _naive(q.double(), keys, vals, prefix, extend, scale, window, softcap).float()
    meta = build_metadata(table, seq_rows, prefix, extend, "cpu")
    assert meta.max_extend <= cpu_ops.ATTEND_MAX_EXTEND  # the C path, not the fallback
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = cpu_ops.attention(q, k, v, k_cache, v_cache, meta, scale, window, softcap)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_cache[meta.out_cache_loc], k, rtol=0, atol=0)
    torch.testing.assert_close(v_cache[meta.out_cache_loc], v, rtol=0, atol=0)


def test_a_long_extend_falls_back_to_the_reference() -> None:
    g = torch.Generator().manual_seed(9)
    n = cpu_ops.ATTEND_MAX_EXTEND + 1
    table = torch.arange(1, 65).view(1, 64)
    k_cache, v_cache = torch.randn(65, 1, 32, generator=g), torch.randn(65, 1, 32, generator=g)
    q, k, v = torch.randn(n, 2, 32, generator=g), torch.randn(n, 1, 32, generator=g), torch.randn(n, 1, 32, generator=g)
    meta = build_metadata(table, [0], [0], [n], "cpu")
    got = cpu_ops.attention(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.2, None)
    meta2 = build_metadata(table, [0], [0], [n], "cpu")
    assert torch.equal(got, paged_attention(q, k, v, k_cache, v_cache, meta2, 0.2, None))  # the same code ran


def test_same_functions_as_the_triton_kernels() -> None:
    """``layers.fused_kernels`` hands the model either module: the names and parameters match."""
    import inspect

    pytest.importorskip("triton")
    from aserve.kernels import fused

    for name in ("rmsnorm", "add_rmsnorm", "rotary", "gated"):
        want = list(inspect.signature(getattr(fused, name)).parameters)
        assert list(inspect.signature(getattr(cpu_ops, name)).parameters) == want, name

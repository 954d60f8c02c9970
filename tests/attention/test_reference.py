"""Reference paged attention vs a naive per-sequence loop in float64."""

from __future__ import annotations

import math

import pytest
import torch

from aserve.attention.metadata import build_metadata
from aserve.attention.reference import paged_attention

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _naive(
    q: torch.Tensor, keys: list[torch.Tensor], vals: list[torch.Tensor], prefix: list[int], extend: list[int],
    scale: float, window: int | None, softcap: float | None,
) -> torch.Tensor:  # fmt: skip
    outs = []
    t = 0
    group = q.shape[1] // keys[0].shape[1]
    for b, (p, e) in enumerate(zip(prefix, extend, strict=True)):
        k = keys[b].repeat_interleave(group, dim=1)  # [L, H, D]
        v = vals[b].repeat_interleave(group, dim=1)
        for j in range(e):
            pos = p + j
            lo = 0 if window is None else max(0, pos - window + 1)
            s = torch.einsum("hd,lhd->hl", q[t], k[lo : pos + 1]) * scale  # [H, L]
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            outs.append(torch.einsum("hl,lhd->hd", torch.softmax(s, -1), v[lo : pos + 1]))
            t += 1
    return torch.stack(outs)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "window", "softcap", "seed"),
    [(4, 4, None, None, 0), (8, 2, None, None, 1), (6, 3, 3, None, 2), (4, 1, 5, 20.0, 3), (2, 2, 1, None, 4)],
)
@pytest.mark.parametrize("device", DEVICES)
def test_matches_naive(
    heads: int, kv_heads: int, window: int | None, softcap: float | None, seed: int, device: str
) -> None:
    g = torch.Generator().manual_seed(seed)
    dim, rows, max_ctx = 16, 5, 40
    num_slots = rows * max_ctx + 1
    prefix = [0, 7, 12, 3, 0]
    extend = [9, 1, 1, 6, 1]
    seq_rows = [3, 0, 4, 1, 2]
    perm = torch.randperm(num_slots - 1, generator=g) + 1
    table = perm[: rows * max_ctx].view(rows, max_ctx).clone()
    k_cache = torch.randn(num_slots, kv_heads, dim, generator=g, dtype=torch.float64)
    v_cache = torch.randn(num_slots, kv_heads, dim, generator=g, dtype=torch.float64)
    total = sum(extend)
    q = torch.randn(total, heads, dim, generator=g, dtype=torch.float64)
    k = torch.randn(total, kv_heads, dim, generator=g, dtype=torch.float64)
    v = torch.randn(total, kv_heads, dim, generator=g, dtype=torch.float64)
    # What each sequence's full key/value list looks like after the write.
    keys, vals, t = [], [], 0
    for row, p, e in zip(seq_rows, prefix, extend, strict=True):
        slots = table[row, :p]
        keys.append(torch.cat([k_cache[slots], k[t : t + e]]))
        vals.append(torch.cat([v_cache[slots], v[t : t + e]]))
        t += e
    scale = 1 / math.sqrt(dim)
    expected = _naive(q, keys, vals, prefix, extend, scale, window, softcap)
    dev = torch.device(device)
    q, k, v, k_cache, v_cache = (x.to(dev) for x in (q, k, v, k_cache, v_cache))
    meta = build_metadata(table.to(dev), seq_rows, prefix, extend, dev)
    out = paged_attention(q, k, v, k_cache, v_cache, meta, scale, window, softcap).cpu()
    assert out.shape == (total, heads, dim)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    # The new K/V landed in their slots.
    torch.testing.assert_close(k_cache[meta.out_cache_loc], k)
    # A second layer reuses the cached layout and gives the same answer.
    out2 = paged_attention(q, k, v, k_cache, v_cache, meta, scale, window, softcap).cpu()
    torch.testing.assert_close(out2, out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_no_host_sync() -> None:
    dev = torch.device("cuda")
    table = torch.randperm(4 * 32, device=dev).view(4, 32)
    meta = build_metadata(table, [2, 0, 3], [0, 5, 9], [7, 1, 1], dev)
    q = torch.randn(9, 4, 16, device=dev, dtype=torch.bfloat16)
    k = torch.randn(9, 2, 16, device=dev, dtype=torch.bfloat16)
    kc = torch.zeros(4 * 32, 2, 16, device=dev, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for window in (None, 3, None):
            out = paged_attention(q, k, k, kc, vc, meta, 0.25, window)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.shape == (9, 4, 16) and bool(torch.isfinite(out).all())

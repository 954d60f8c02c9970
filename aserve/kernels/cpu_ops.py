"""The small ops of a CPU forward pass as single calls into ``_ggufmm`` (``_cpu_ops.h``).

The CPU counterpart of ``fused.py``'s Triton kernels, with the same signatures: a decode step
of the default model runs ~1,000 of torch's eager ops for its norms, rotary and attention,
each a few microseconds of dispatch on tensors of a few hundred floats. Float32 only; the
arithmetic is the eager modules', sums in another order (results agree to rounding).
``attention`` covers steps whose sequences each add at most ``ATTEND_MAX_EXTEND`` tokens
(decodes, short extends); longer prefills keep the reference's SDPA, which tiles its work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aserve.attention.metadata import AttentionMetadata
from aserve.attention.reference import paged_attention
from aserve.kernels.gguf_linear import _k

ATTEND_MAX_EXTEND = 16


def available() -> bool:
    from aserve.kernels.gguf_linear import kernel

    return kernel() is not None


def _f32(x: torch.Tensor) -> torch.Tensor:
    assert x.dtype == torch.float32 and x.device.type == "cpu", f"want float32 on CPU, got {x.dtype} on {x.device}"
    return x.contiguous()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """x: [..., dim] -> same shape."""
    x, w = _f32(x), _f32(weight)
    y = torch.empty_like(x)
    dim = x.shape[-1]
    _k().rmsnorm(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel() // dim, dim, eps, gemma)
    return y


def add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    gemma: bool,
    x_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + x`` (``residual + norm_x(x)`` with ``x_weight``, same eps), ``(h, norm(h))``."""
    x, r, w = _f32(x), _f32(residual), _f32(weight)
    assert x.shape == r.shape, (x.shape, r.shape)
    xw = None if x_weight is None else _f32(x_weight)
    h, y = torch.empty_like(x), torch.empty_like(x)
    dim = x.shape[-1]
    _k().add_rmsnorm(x.data_ptr(), r.data_ptr(), w.data_ptr(), 0 if xw is None else xw.data_ptr(), h.data_ptr(),
                     y.data_ptr(), x.numel() // dim, dim, eps, eps, gemma)  # fmt: skip
    return h, y


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos/sin: [T, 1, D] (or [T, D]) -> [T, heads, D]."""
    x, c, s = _f32(x), _f32(cos), _f32(sin)
    t, heads, d = x.shape
    assert c.numel() == t * d and s.numel() == t * d, (c.shape, x.shape)
    y = torch.empty_like(x)
    _k().rotary(x.data_ptr(), y.data_ptr(), c.data_ptr(), s.data_ptr(), t, heads, d)
    return y


def gated(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up: torch's own vectorised GELU / SiLU (two ops; tanh has no cheap C form)."""
    g = F.gelu(gate, approximate="tanh") if act == "gelu_tanh" else F.silu(gate)
    return g.mul_(up)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    softcap: float | None = None,
) -> torch.Tensor:
    """``paged_attention``'s contract (write the new K/V, attend causally over each sequence's
    keys; q [T, H, D] -> [T, H, D]) in one pass over the cache slots, no padded copies."""
    if meta.max_extend > ATTEND_MAX_EXTEND or k_cache.dtype != torch.float32 or q.dtype != torch.float32:
        return paged_attention(q, k, v, k_cache, v_cache, meta, scale, sliding_window, softcap)
    t, heads, d = q.shape
    kv_heads = k.shape[1]
    q, k, v = _f32(q), _f32(k), _f32(v)
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[1:] == (kv_heads, d)
    loc = meta.out_cache_loc.contiguous()
    kern = _k()
    kern.store_kv(k.data_ptr(), v.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), loc.data_ptr(), t, kv_heads * d)
    rows = meta.cache.get("cpu_token_rows")
    if rows is None:
        rows = meta.cache["cpu_token_rows"] = torch.repeat_interleave(
            meta.req_pool_indices, meta.extend_lens, output_size=t
        ).contiguous()
    table = meta.req_to_token
    assert table.dtype == torch.int64 and table.is_contiguous() and rows.dtype == torch.int64
    pos = meta.positions.contiguous()
    out = torch.empty_like(q)
    kern.attend(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), table.data_ptr(), table.shape[1],
                rows.data_ptr(), pos.data_ptr(), t, heads, kv_heads, d, sliding_window or 0, scale, softcap or 0.0,
                out.data_ptr(), torch.get_num_threads())  # fmt: skip
    return out

"""The small ops of a CPU forward pass as single calls into ``_ggufmm`` (``_cpu_ops.h``).

The CPU counterpart of ``fused.py``'s Triton kernels, with the same signatures: a decode step
of the default model runs ~1,000 of torch's eager ops for its norms, rotary and attention,
each a few microseconds of dispatch on tensors of a few hundred floats. Float32 only; the
arithmetic is the eager modules', sums in another order (results agree to rounding).
``attention`` covers steps whose sequences each add at most ``ATTEND_MAX_EXTEND`` tokens
(decodes, short extends); longer prefills keep the reference's SDPA, which tiles its work.
"""

from __future__ import annotations

import struct

import torch
import torch.nn.functional as F

from aserve.attention.metadata import AttentionMetadata
from aserve.attention.reference import paged_attention
from aserve.kernels.gguf_linear import GEMM_MIN_ROWS, QTYPES, REPACKED, GGUFLinear, _k

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
    """act(gate) * up (GELU with the tanh approximation, or SiLU): one pass, no temporaries.
    Closer to the exact function than torch's float32 GELU where tanh is near -1 (see
    ``ops_gated``), otherwise equal to float32 rounding."""
    g, u = _f32(gate), _f32(up)
    assert g.shape == u.shape, (g.shape, u.shape)
    if g.numel() % 16:
        a = F.gelu(g, approximate="tanh") if act == "gelu_tanh" else F.silu(g)
        return a.mul_(u)
    y = torch.empty_like(g)
    _k().gated(g.data_ptr(), u.data_ptr(), y.data_ptr(), g.numel(), _ACTS[act])
    return y


_ACTS = {"silu": 0, "gelu_tanh": 1}


def _token_rows(meta: AttentionMetadata, t: int) -> torch.Tensor:
    """[T] int64: each new token's table row, computed once per step (every layer asks)."""
    rows = meta.cache.get("cpu_token_rows")
    if rows is None:
        rows = meta.cache["cpu_token_rows"] = torch.repeat_interleave(
            meta.req_pool_indices, meta.extend_lens, output_size=t
        ).contiguous()
    return rows


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
    rows = _token_rows(meta, t)
    table = meta.req_to_token
    assert table.dtype == torch.int64 and table.is_contiguous() and rows.dtype == torch.int64
    pos = meta.positions.contiguous()
    out = torch.empty_like(q)
    kern.attend(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), table.data_ptr(), table.shape[1],
                rows.data_ptr(), pos.data_ptr(), t, heads, kv_heads, d, sliding_window or 0, scale, softcap or 0.0,
                out.data_ptr(), torch.get_num_threads())  # fmt: skip
    return out


# --- a decoder stack's step in one call (decoder_layers in _ggufmm.c) ---------------------------

_use_stack = True


def set_decoder_stack(on: bool) -> bool:
    """Whether eligible steps run their decoder layers in one C call (``decoder_stack``);
    returns the previous setting. For tests and A/B timings: both paths give the same bits."""
    global _use_stack
    prev, _use_stack = _use_stack, on
    return prev


# One plan record: 7 projections of (qtype, blocks, bias, n, k, bf16), 6 norm weights, the KV
# cache's two tensors, 8 integers, 4 doubles; _ggufmm.c's struct layer_rec, field for field.
_RECORD = struct.Struct("<" + "q" * (7 * 6 + 6 + 2 + 6) + "d" * 4)
# The GGUF layouts a projection of the stack may have (the head's Q8_0X16 is not one).
STACK_QTYPES = frozenset({*REPACKED.values(), QTYPES["Q8_0"]})


def layer_record(
    projs: list[GGUFLinear],
    norms: list[torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    shape: tuple[int, int, int, int],
    gemma: bool,
    act: str,
    eps: tuple[float, float],
    scale: float,
    softcap: float | None,
) -> bytes:
    """One layer's plan record for ``decoder_stack``. projs: q, k, v, o, gate, up, down (GGUF
    blocks in ``STACK_QTYPES``, float activations); norms: the weights of the q and k norms, the
    attention output's, the MLP input's, the MLP output's and the next (or final) norm, None
    where there is none; kv: the layer's float32 cache; shape: (heads, kv heads, head dim,
    sliding window or 0); eps: (the layer norms', the q/k norms')."""
    fields: list[int] = []
    for p in projs:
        assert p.qtype in STACK_QTYPES and not p.int8_activations, p
        bias = 0 if p.bias is None else _f32(p.bias).data_ptr()
        fields += [p.qtype, p.blocks.data_ptr(), bias, p.out_features, p.in_features, int(p.gemm_bf16)]
    k_cache, v_cache = kv
    assert k_cache.dtype == torch.float32 and k_cache.is_contiguous() and v_cache.is_contiguous()
    fields += [0 if n is None else _f32(n).data_ptr() for n in norms]
    fields += [k_cache.data_ptr(), v_cache.data_ptr(), *shape, int(gemma), _ACTS[act]]
    return _RECORD.pack(*fields, eps[0], eps[1], scale, softcap or 0.0)


def pack_plan(records: list[bytes]) -> torch.Tensor:
    assert _RECORD.size == _k().layer_record_size(), "cpu_ops._RECORD and _ggufmm.c's struct layer_rec differ"
    return torch.frombuffer(bytearray(b"".join(records)), dtype=torch.uint8)


def decoder_stack(
    plan: torch.Tensor,
    h: torch.Tensor,
    x: torch.Tensor,
    ropes: list[tuple[torch.Tensor, torch.Tensor]],
    meta: AttentionMetadata,
) -> torch.Tensor | None:
    """A decoder stack's step in one C call (``decoder_layers``): h [T, hidden] the embeddings,
    x their first input norm, ropes each layer's (cos, sin) -> the final norm of the last
    layer's output; None (nothing done) when the step is not one it runs: switched off, more
    than ``GEMM_MIN_ROWS - 1`` tokens (a prefill's matmuls take torch's GEMM), a sequence adding
    more than ``ATTEND_MAX_EXTEND`` tokens."""
    t = h.shape[0]
    if not _use_stack or t >= GEMM_MIN_ROWS or meta.max_extend > ATTEND_MAX_EXTEND or h.dtype != torch.float32:
        return None
    rp = torch.tensor([_f32(p).data_ptr() for cs in ropes for p in cs], dtype=torch.int64)
    rows = _token_rows(meta, t)
    table, loc, pos = meta.req_to_token, meta.out_cache_loc.contiguous(), meta.positions.contiguous()
    assert table.dtype == torch.int64 and table.is_contiguous()
    h, x = h.contiguous().clone(), x.contiguous().clone()
    decode = meta.max_extend == 1  # bfloat16 tiles for decode steps only: a prompt's logits stay float32
    _k().decoder_layers(plan.data_ptr(), len(ropes), h.data_ptr(), x.data_ptr(), t, h.shape[1], rp.data_ptr(),
                        loc.data_ptr(), table.data_ptr(), table.shape[1], rows.data_ptr(), pos.data_ptr(),
                        torch.get_num_threads(), decode)  # fmt: skip
    return x

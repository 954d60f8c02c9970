"""Fused small ops in Triton: RMSNorm (Llama and Gemma ``1 + w`` forms), RMSNorm fused with
the residual add (and, for Gemma's sandwich norms, with the sub-block's post-norm), rotary
embedding, gated activations. Each replaces several eager kernels (and their Python launches) by one.

They follow the torch definitions in ``aserve/models/layers.py``: statistics in float32;
RMSNorm rounds where the model does (Gemma: once at the end; Llama: the normalised value is
cast back before the weight multiplies it); rotary and the gated product compute in float32
and round once (within bf16 rounding of the eager result). Opt-in with
``EngineConfig(fused_ops=True)`` on CUDA; tested against the torch ops on random shapes (on
a CPU through Triton's interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_row(x, w, dim, eps, GEMMA: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """One row of RMSNorm in float32, rounded to ``OUT_DTYPE`` where the eager module rounds."""
    rs = 1.0 / tl.sqrt(tl.sum(x * x, 0) / dim + eps)
    if GEMMA:
        y = x * rs * (1.0 + w.to(tl.float32))
    else:
        y = (x * rs).to(OUT_DTYPE).to(tl.float32) * w.to(tl.float32)
    return y.to(OUT_DTYPE)


@triton.jit
def _rmsnorm_kernel(X, W, Y, stride_x, stride_y, dim, eps, GEMMA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0)
    tl.store(Y + row * stride_y + cols, _norm_row(x, w, dim, eps, GEMMA, Y.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """x: [..., dim] -> same shape and dtype."""
    dim = x.shape[-1]
    x2 = x.reshape(-1, dim)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rmsnorm_kernel[(x2.shape[0],)](
            x2, weight, y, x2.stride(0), y.stride(0), dim, eps, GEMMA=gemma, BLOCK=triton.next_power_of_2(dim)
        )
    return y.view(x.shape)


@triton.jit
def _add_rmsnorm_kernel(
    X, R, WX, W, H, Y, stride_x, stride_r, stride_h, stride_y, dim, eps,
    GEMMA: tl.constexpr, NORM_X: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """h = residual + (norm_x(x) if NORM_X else x), rounded; y = norm(h). One row per program."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    dt = H.dtype.element_ty
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if NORM_X:
        wx = tl.load(WX + cols, mask=mask, other=0.0)
        x = _norm_row(x, wx, dim, eps, GEMMA, dt).to(tl.float32)
    r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(dt)
    tl.store(H + row * stride_h + cols, h, mask=mask)
    w = tl.load(W + cols, mask=mask, other=0.0)
    y = _norm_row(h.to(tl.float32), w, dim, eps, GEMMA, dt)
    tl.store(Y + row * stride_y + cols, y, mask=mask)


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool,
    x_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``h = residual + x`` (Gemma: ``residual + norm_x(x)`` with ``x_weight``), ``y = norm(h)``.

    x, residual: [T, dim] -> (h, y), both [T, dim] in x's dtype; one kernel instead of the
    eager add and norm(s). Rounds where the eager modules do, so h is bit-identical to them."""
    t, dim = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    residual = residual if residual.stride(-1) == 1 else residual.contiguous()
    h = torch.empty((t, dim), dtype=x.dtype, device=x.device)
    y = torch.empty_like(h)
    if t:
        _add_rmsnorm_kernel[(t,)](
            x, residual, weight if x_weight is None else x_weight, weight, h, y,
            x.stride(0), residual.stride(0), h.stride(0), y.stride(0), dim, eps,
            GEMMA=gemma, NORM_X=x_weight is not None, BLOCK=triton.next_power_of_2(dim),
        )  # fmt: skip
    return h, y


@triton.jit
def _rotary_kernel(X, Cos, Sin, Y, stride_xt, stride_xh, stride_ct, stride_yt, stride_yh, HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    i = tl.arange(0, HALF)
    x1 = tl.load(X + t * stride_xt + h * stride_xh + i).to(tl.float32)
    x2 = tl.load(X + t * stride_xt + h * stride_xh + HALF + i).to(tl.float32)
    c1 = tl.load(Cos + t * stride_ct + i).to(tl.float32)
    c2 = tl.load(Cos + t * stride_ct + HALF + i).to(tl.float32)
    s1 = tl.load(Sin + t * stride_ct + i).to(tl.float32)
    s2 = tl.load(Sin + t * stride_ct + HALF + i).to(tl.float32)
    # rotate_half(x) = (-x2, x1)
    y1 = x1 * c1 - x2 * s1
    y2 = x2 * c2 + x1 * s2
    tl.store(Y + t * stride_yt + h * stride_yh + i, y1.to(Y.dtype.element_ty))
    tl.store(Y + t * stride_yt + h * stride_yh + HALF + i, y2.to(Y.dtype.element_ty))


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos/sin: [T, 1, D] (or [T, D]) -> [T, heads, D]."""
    t, heads, d = x.shape
    cos2, sin2 = cos.reshape(t, d), sin.reshape(t, d)
    if cos2.stride(-1) != 1 or sin2.stride(-1) != 1 or cos2.stride(0) != sin2.stride(0):
        cos2, sin2 = cos2.contiguous(), sin2.contiguous()
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty((t, heads, d), dtype=x.dtype, device=x.device)
    if t:
        _rotary_kernel[(t, heads)](
            x, cos2, sin2, y, x.stride(0), x.stride(1), cos2.stride(0), y.stride(0), y.stride(1), HALF=d // 2
        )
    return y


@triton.jit
def _gated_kernel(G, U, Y, n, GELU: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=mask, other=0.0).to(tl.float32)
    if GELU:
        # gelu, tanh approximation; tanh(z) = 2 * sigmoid(2z) - 1
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        act = 0.5 * g * (1.0 + (2.0 * tl.sigmoid(2.0 * z) - 1.0))
    else:
        act = g * tl.sigmoid(g)
    tl.store(Y + offs, (act * u).to(Y.dtype.element_ty), mask=mask)


def gated(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up, elementwise; act is "gelu_tanh" or "silu"."""
    gate, up = gate.contiguous(), up.contiguous()
    y = torch.empty_like(gate)
    n = gate.numel()
    if n:
        block = 1024
        _gated_kernel[(triton.cdiv(n, block),)](gate, up, y, n, GELU=act == "gelu_tanh", BLOCK=block)
    return y

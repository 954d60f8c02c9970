"""Fused small ops in Triton: RMSNorm (Llama and Gemma ``1 + w`` forms), RMSNorm fused with
the residual add (and, for Gemma's sandwich norms, with the sub-block's post-norm), rotary
embedding, gated activations, and the attention block's prologue (q/k norm, rotary and the
KV cache write from one fused q/k/v projection). Each replaces several eager kernels (and
their Python launches) by one.

They follow the torch definitions in ``aserve/models/layers.py``: statistics in float32;
RMSNorm rounds where the model does (Gemma: once at the end; Llama: the normalised value is
cast back before the weight multiplies it); rotary and the gated product compute in float32
and round once (within bf16 rounding of the eager result). Opt-in with
``EngineConfig(fused_ops=True)`` on CUDA; tested against the torch ops on random shapes (on
a CPU through Triton's interpreter).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from aserve.kernels.pdl import launch_args, wait_for_prior


@triton.jit
def _scale_row(x, rs, w, GEMMA: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """RMSNorm's second half: ``x`` (float32) times ``rs = 1 / rms`` and the weight, rounded
    to ``OUT_DTYPE`` where the eager module rounds."""
    if GEMMA:
        y = x * rs * (1.0 + w.to(tl.float32))
    else:
        y = (x * rs).to(OUT_DTYPE).to(tl.float32) * w.to(tl.float32)
    return y.to(OUT_DTYPE)


@triton.jit
def _norm_row(x, w, dim, eps, GEMMA: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """One row of RMSNorm in float32, rounded to ``OUT_DTYPE`` where the eager module rounds."""
    rs = 1.0 / tl.sqrt(tl.sum(x * x, 0) / dim + eps)
    return _scale_row(x, rs, w, GEMMA, OUT_DTYPE)


@triton.jit
def _rmsnorm_kernel(X, W, Y, stride_x, stride_y, dim, eps, GEMMA: tl.constexpr, BLOCK: tl.constexpr,
                    PDL: tl.constexpr):  # fmt: skip
    wait_for_prior(PDL)
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
        _rmsnorm_kernel[(x2.shape[0],)](x2, weight, y, x2.stride(0), y.stride(0), dim, eps, GEMMA=gemma,
                                        BLOCK=triton.next_power_of_2(dim), **launch_args(x2))  # fmt: skip
    return y.view(x.shape)


@triton.jit
def _add_rmsnorm_kernel(
    X, R, WX, W, H, Y, stride_xs, stride_x, stride_r, stride_h, stride_y, dim, eps,
    GEMMA: tl.constexpr, NORM_X: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """h = residual + (norm_x(x) if NORM_X else x), rounded; y = norm(h). One row per program.
    SPLITS > 1: x is the sum of a split-K GEMM's float32 partial products (X[s], ``stride_xs``
    apart), rounded to the model's dtype once, as the GEMM's own output would be."""
    wait_for_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    dt = H.dtype.element_ty
    x_row = X + row * stride_x + cols
    x = tl.load(x_row, mask=mask, other=0.0).to(tl.float32)
    if SPLITS > 1:
        for s in tl.static_range(1, SPLITS):
            x += tl.load(x_row + s * stride_xs.to(tl.int64), mask=mask, other=0.0)
        x = x.to(dt).to(tl.float32)
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

    x, residual: [T, dim] -> (h, y), both [T, dim] in residual's dtype; one kernel instead of
    the eager add and norm(s). Rounds where the eager modules do, so h is bit-identical to them.
    x may also be a split-K GEMM's float32 partial products [S, T, dim] (``kernels.linear``):
    their sum, rounded to residual's dtype, is the x added."""
    t, dim = residual.shape
    splits = x.shape[0] if x.dim() == 3 else 1
    assert x.dtype == (torch.float32 if x.dim() == 3 else residual.dtype), (x.dtype, residual.dtype)
    x3 = x if x.dim() == 3 else x.unsqueeze(0)
    assert x3.shape[1:] == (t, dim), (tuple(x.shape), t, dim)
    x3 = x3 if x3.stride(-1) == 1 else x3.contiguous()
    residual = residual if residual.stride(-1) == 1 else residual.contiguous()
    h = torch.empty((t, dim), dtype=residual.dtype, device=residual.device)
    y = torch.empty_like(h)
    if t:
        _add_rmsnorm_kernel[(t,)](
            x3, residual, weight if x_weight is None else x_weight, weight, h, y,
            x3.stride(0), x3.stride(1), residual.stride(0), h.stride(0), y.stride(0), dim, eps,
            GEMMA=gemma, NORM_X=x_weight is not None, SPLITS=splits, BLOCK=triton.next_power_of_2(dim),
            **launch_args(residual),
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
def _gated_kernel(G, U, Y, stride_g, stride_u, stride_y, n, GELU: tl.constexpr, BLOCK: tl.constexpr,
                  PDL: tl.constexpr):  # fmt: skip
    wait_for_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (_act(g, GELU) * u).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _act(g, GELU: tl.constexpr):
    """gelu (tanh approximation; tanh(z) = 2 * sigmoid(2z) - 1) or silu of float32 ``g``."""
    if GELU:
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        return 0.5 * g * (1.0 + (2.0 * tl.sigmoid(2.0 * z) - 1.0))
    return g * tl.sigmoid(g)


def gated(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up, elementwise; act is "gelu_tanh" or "silu". ``gate`` and ``up`` may be
    the two column halves of one fused gate/up projection ([T, 2I] -> two [T, I] views)."""
    shape = gate.shape
    n = shape[-1]
    gate, up = gate.reshape(-1, n), up.reshape(-1, n)
    gate = gate if gate.stride(-1) == 1 else gate.contiguous()
    up = up if up.stride(-1) == 1 else up.contiguous()
    y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if y.numel():
        block = min(1024, triton.next_power_of_2(n))
        _gated_kernel[(gate.shape[0], triton.cdiv(n, block))](
            gate, up, y, gate.stride(0), up.stride(0), y.stride(0), n, GELU=act == "gelu_tanh", BLOCK=block,
            **launch_args(y),
        )  # fmt: skip
    return y.view(shape)


@triton.jit
def _gate_up_kernel(
    X, W, Y, M, N, K, stride_xm, stride_wn, stride_ym,
    GELU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """One [BM, BN] tile of ``act(x @ W[:N].T) * (x @ W[N:].T)``: the gate and up products of a
    packed [gate; up] weight [2N, K] side by side, each rounded to the output dtype as the
    GEMM's output would be, then the activation and product in float32, rounded once."""
    wait_for_prior(PDL)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    n_ok = rn < N
    acc_g = tl.zeros([BM, BN], tl.float32)
    acc_u = tl.zeros([BM, BN], tl.float32)
    for k in range(0, K, BK):
        k_ok = (k + rk) < K
        a = tl.load(X + rm[:, None].to(tl.int64) * stride_xm + (k + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)  # fmt: skip
        w_ptrs = W + rn[None, :].to(tl.int64) * stride_wn + (k + rk)[:, None]  # [BK, BN]: W[n, k] transposed
        w_mask = k_ok[:, None] & n_ok[None, :]
        wg = tl.load(w_ptrs, mask=w_mask, other=0.0)
        wu = tl.load(w_ptrs + N * stride_wn, mask=w_mask, other=0.0)
        acc_g = tl.dot(a, wg, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, wu, acc_u, input_precision=PRECISION)
    dt = Y.dtype.element_ty
    g = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    y = (_act(g, GELU) * u).to(dt)
    tl.store(Y + rm[:, None].to(tl.int64) * stride_ym + rn[None, :], y, mask=m_ok[:, None] & n_ok[None, :])


def gate_up_gated(x: torch.Tensor, gate_up_weight: torch.Tensor, act: str) -> torch.Tensor:
    """``act(x @ gate.T) * (x @ up.T)`` for a packed [gate; up] weight [2I, H]: the gate/up GEMM
    and the gated activation in one kernel, so the [T, 2I] product is never written. x: [T, H]
    -> [T, I]. Used by ``GatedMLP`` where ``ASERVE_MLP_KERNEL=triton`` (to measure against
    cuBLAS's GEMM and ``gated``)."""
    t, k = x.shape
    n = gate_up_weight.shape[0] // 2
    x = x if x.stride(-1) == 1 else x.contiguous()
    assert gate_up_weight.stride(-1) == 1 and gate_up_weight.shape[1] == k
    y = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t:
        bm = 16 if t <= 16 else 32 if t <= 32 else 64
        bn, bk = 64, 64
        _gate_up_kernel[(triton.cdiv(t, bm), triton.cdiv(n, bn))](
            x, gate_up_weight, y, t, n, k, x.stride(0), gate_up_weight.stride(0), y.stride(0),
            GELU=act == "gelu_tanh", BM=bm, BN=bn, BK=bk, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            num_warps=4, num_stages=3, **launch_args(x),
        )  # fmt: skip
    return y


@triton.jit
def _qkv_prep_kernel(
    QKV, QW, KW, Cos, Sin, Slots, Q, KC, VC,
    stride_t, stride_ct, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, eps,
    H: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr, NORM: tl.constexpr, GEMMA: tl.constexpr,
    HB: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One token's heads ``[HB * pid1, HB * (pid1 + 1))`` of a fused q/k/v projection row
    [q heads | k heads | v heads], one head per tile row: per-head RMSNorm (q and k, when
    NORM), rotary (q and k), q to ``Q``, k and v to the KV cache at the token's slot. Rounds
    where the eager norm, rotary and cache write round."""
    wait_for_prior(PDL)
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * HB + tl.arange(0, HB)[:, None]  # [HB, 1] head of the row
    i = tl.arange(0, HALF)[None, :]  # [1, HALF]
    live = j < H + 2 * HKV
    is_q = j < H
    is_v = j >= H + HKV
    dt = Q.dtype.element_ty
    src = QKV + t * stride_t + j * (2 * HALF) + i
    x1 = tl.load(src, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=live, other=0.0).to(tl.float32)
    v1, v2 = x1, x2
    if NORM:
        rs = 1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.where(is_q, tl.load(QW + i), tl.load(KW + i))
        w2 = tl.where(is_q, tl.load(QW + HALF + i), tl.load(KW + HALF + i))
        x1 = _scale_row(x1, rs, w1, GEMMA, dt).to(tl.float32)
        x2 = _scale_row(x2, rs, w2, GEMMA, dt).to(tl.float32)
    c1 = tl.load(Cos + t * stride_ct + i).to(tl.float32)
    c2 = tl.load(Cos + t * stride_ct + HALF + i).to(tl.float32)
    s1 = tl.load(Sin + t * stride_ct + i).to(tl.float32)
    s2 = tl.load(Sin + t * stride_ct + HALF + i).to(tl.float32)
    y1 = tl.where(is_v, v1, x1 * c1 - x2 * s1).to(dt)  # rotate_half(x) = (-x2, x1); v as is
    y2 = tl.where(is_v, v2, x2 * c2 + x1 * s2).to(dt)
    tl.store(Q + t * stride_qt + j * stride_qh + i, y1, mask=is_q)
    tl.store(Q + t * stride_qt + j * stride_qh + HALF + i, y2, mask=is_q)
    slot = tl.load(Slots + t)
    is_k = (j >= H) & (j < H + HKV)
    k_dst = KC + slot * stride_ks + (j - H).to(tl.int64) * stride_kh + i  # a head-major cache: 64-bit offsets
    tl.store(k_dst, y1.to(KC.dtype.element_ty), mask=is_k)
    tl.store(k_dst + HALF, y2.to(KC.dtype.element_ty), mask=is_k)
    v_dst = VC + slot * stride_vs + (j - H - HKV).to(tl.int64) * stride_vh + i
    tl.store(v_dst, y1.to(VC.dtype.element_ty), mask=is_v & live)
    tl.store(v_dst + HALF, y2.to(VC.dtype.element_ty), mask=is_v & live)


def qkv_prep_heads(num_heads: int, num_kv_heads: int, head_dim: int) -> int:
    """Heads per program of ``qkv_prep``: all of a token's q, k and v heads in one program
    up to 4,096 values (Gemma 3 270M: 6 heads of 256; Llama 3.2 1B: 48 of 64), so a step
    of T tokens launches about T programs, not T per head. ``ASERVE_QKV_HEADS`` overrides
    it (a power of two; 1: a program per head, to measure)."""
    env = os.environ.get("ASERVE_QKV_HEADS")
    if env:
        hb = int(env)
        if hb < 1 or hb & (hb - 1):
            raise ValueError(f"ASERVE_QKV_HEADS={env!r}: a power of two")
        return hb
    return min(triton.next_power_of_2(num_heads + 2 * num_kv_heads), max(1, 4096 // head_dim))


def qkv_prep(
    qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
    q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float, gemma: bool,
    cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """From a fused projection ``qkv`` [T, (H + 2 Hkv) D]: q [T, H, D] normed (optional) and
    rotated; k likewise and v as is, stored at ``slots`` [T] in the caches [S, Hkv, D].
    One kernel in place of two norms, two rotaries and the two cache writes."""
    t = qkv.shape[0]
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim and qkv.stride(-1) == 1
    assert (q_weight is None) == (k_weight is None)
    cos2, sin2 = cos.reshape(t, head_dim), sin.reshape(t, head_dim)
    if cos2.stride(-1) != 1 or sin2.stride(-1) != 1 or cos2.stride(0) != sin2.stride(0):
        cos2, sin2 = cos2.contiguous(), sin2.contiguous()
    q = torch.empty((t, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if t:
        hb = qkv_prep_heads(num_heads, num_kv_heads, head_dim)
        _qkv_prep_kernel[(t, triton.cdiv(num_heads + 2 * num_kv_heads, hb))](
            qkv, qkv if q_weight is None else q_weight, qkv if k_weight is None else k_weight,
            cos2, sin2, slots, q, k_cache, v_cache,
            qkv.stride(0), cos2.stride(0), q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), eps,
            H=num_heads, HKV=num_kv_heads, HALF=head_dim // 2, NORM=q_weight is not None, GEMMA=gemma, HB=hb,
            **launch_args(q),
        )  # fmt: skip
    return q


@triton.jit
def _cos_sin_kernel(Pos, Inv, Cos, Sin, stride_p, stride_c, HALF: tl.constexpr, PDL: tl.constexpr):
    """One token's rotary table: ``f = float(pos) * inv_freq`` [HALF], cos(f) and sin(f) rounded
    to the output dtype, each written twice ([f, f], as ``Rotary.cos_sin``'s ``cat``). On NVIDIA
    ``tl.cos`` / ``tl.sin`` lower to libdevice's ``__nv_cosf`` / ``__nv_sinf`` (CUDA's math
    library, as torch's ops; no ``cos.approx``)."""
    wait_for_prior(PDL)
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, HALF)
    f = tl.load(Pos + t * stride_p).to(tl.float32) * tl.load(Inv + i)
    c = tl.cos(f).to(Cos.dtype.element_ty)
    s = tl.sin(f).to(Sin.dtype.element_ty)
    tl.store(Cos + t * stride_c + i, c)
    tl.store(Cos + t * stride_c + HALF + i, c)
    tl.store(Sin + t * stride_c + i, s)
    tl.store(Sin + t * stride_c + HALF + i, s)


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``Rotary.cos_sin`` in one kernel: positions [T] (integers) and ``inv_freq`` [D/2] float32
    -> cos, sin [T, 1, D] in ``dtype``, where torch's ops take eight launches (the float cast,
    the product, the cat, cos, sin and two casts)."""
    t, half = positions.shape[0], inv_freq.shape[0]
    cos = torch.empty((t, 1, 2 * half), dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    if t:
        _cos_sin_kernel[(t,)](positions, inv_freq, cos, sin, positions.stride(0), cos.stride(0), HALF=half,
                              **launch_args(cos))  # fmt: skip
    return cos, sin

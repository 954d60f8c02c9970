"""A Triton GEMM for a decode step's small layer projections, with split-K (issue 15, measured
against cuBLAS by ``python -m aserve.bench.layer_gemms``).

At 256 rows the Gemma 3 270M shape's projections (hidden 640) are latency-bound: cuBLAS spends
~5 us on each where their weights take under 1 us to read, and a handful of output tiles leave
most SMs idle. ``linear`` tiles the output small and may split K across programs: with
``split_k`` > 1 each program writes its part of the product in float32 to its own slice of a
[split_k, M, N] buffer, for a consumer that sums the slices as it reads them (the norm or
activation kernel after the GEMM), so no reduction kernel or atomics are needed.

The model uses it for the projections whose consumer is the fused residual add + norm (the
attention's output projection and the MLP's down projection: ``layers.project``), where
:func:`split_k_launch` picks a launch for the step's shape; elsewhere cuBLAS. ``ASERVE_SPLIT_K=0``
(read at import) keeps cuBLAS everywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from aserve.kernels.pdl import launch_args, wait_for_prior

ON = os.environ.get("ASERVE_SPLIT_K", "1") == "1"


@dataclass(frozen=True)
class LinearLaunch:
    """One launch configuration: output tile (block_m x block_n), K step, K splits, warps, stages."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _linear_kernel(
    X, W, Y, M, N, K, k_per_split, stride_xm, stride_wn, stride_ys, stride_ym,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Y[s, m-tile, n-tile] = X[m-tile, ks] @ W[n-tile, ks].T over split s's K range ks, in float32
    where Y is (split-K), else rounded to Y's dtype. Programs: m-tiles fastest, so the m-tiles
    that share a weight tile run side by side and read it once from HBM."""
    wait_for_prior(PDL)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    split = tl.program_id(2)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    n_ok = rn < N
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    x_ptrs = X + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
    w_ptrs = W + rn[None, :].to(tl.int64) * stride_wn + rk[:, None]  # [BK, BN]: W[n, k] transposed
    acc = tl.zeros([BM, BN], tl.float32)
    for k in range(k_lo, k_hi, BK):
        k_ok = (k + rk) < k_hi
        a = tl.load(x_ptrs + k, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs + k, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    out = Y + split.to(tl.int64) * stride_ys + rm[:, None].to(tl.int64) * stride_ym + rn[None, :]
    tl.store(out, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def linear(x: torch.Tensor, weight: torch.Tensor, launch: LinearLaunch = LinearLaunch(),
           out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``x @ weight.T`` for x [M, K] and an ``nn.Linear`` weight [N, K] (no bias).

    With ``launch.split_k`` 1: [M, N] in x's dtype (float32 accumulation, rounded once, as
    cuBLAS rounds). Otherwise the float32 partial products [split_k, M, N], whose sum over the
    first dimension is the product; a split with no K left writes zeros."""
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.stride(-1) == 1, (tuple(weight.shape), k)
    x = x if x.stride(-1) == 1 else x.contiguous()
    splits = max(1, launch.split_k)
    k_per_split = _k_per_split(k, splits, launch.block_k)
    dtype = x.dtype if splits == 1 else torch.float32
    shape = (m, n) if splits == 1 else (splits, m, n)
    y = out if out is not None else torch.empty(shape, dtype=dtype, device=x.device)
    assert tuple(y.shape) == shape and y.dtype == dtype and y.stride(-1) == 1, (tuple(y.shape), y.dtype)
    if m and n:
        y3 = y.unsqueeze(0) if splits == 1 else y
        grid = (triton.cdiv(m, launch.block_m), triton.cdiv(n, launch.block_n), splits)
        _linear_kernel[grid](
            x, weight, y3, m, n, k, k_per_split, x.stride(0), weight.stride(0), y3.stride(0), y3.stride(1),
            BM=launch.block_m, BN=launch.block_n, BK=launch.block_k,
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            num_warps=launch.num_warps, num_stages=launch.num_stages, **launch_args(x),
        )  # fmt: skip
    return y


def split_k_launch(m: int, n: int, k: int, dtype: torch.dtype) -> LinearLaunch | None:
    """The split-K launch for a [m, k] x [k, n] product feeding the fused add + norm, or None
    where cuBLAS is as fast or faster. From the layer GEMMs measured alone (docs/benchmarks.md,
    thirty-fifth session, ``python -m aserve.bench.layer_gemms``): at 64 rows four splits of
    64 x 32 tiles beat cuBLAS on both shapes' output and down projections (Gemma 3 270M's by ~2 us
    of ~4-6, Llama 3.2 1B's by 1-2.5 us); up to 256 rows, narrow outputs (Gemma's 640) still gain
    with 64 x 64 tiles (output projection 3.2 against 4.5 us, down 5.3 against 6.1); wider
    outputs and 512 rows are cuBLAS's. In whole decode steps on an H100: Gemma's 6% shorter at
    64 rows and 4% at 128, the same at 256; Llama's 1.5% shorter at 64 rows."""
    if not ON or dtype not in (torch.bfloat16, torch.float16):
        return None
    if m <= 64:
        launch = LinearLaunch(block_m=64, block_n=32, block_k=128, split_k=4)
    elif m <= 256 and n <= 1024:
        launch = LinearLaunch(block_m=64, block_n=64, block_k=128, split_k=2 if k <= 1024 else 4)
    else:
        return None
    # Every split must have K to walk (an empty one only writes zeros for the norm to read).
    return launch if (launch.split_k - 1) * _k_per_split(k, launch.split_k, launch.block_k) < k else None


def _k_per_split(k: int, splits: int, block_k: int) -> int:
    """Each split's K range: a whole number of K steps, so only the last split is short (or,
    where K has fewer steps than splits, empty: ``linear`` then writes its slice as zeros)."""
    return triton.cdiv(triton.cdiv(k, splits), block_k) * block_k

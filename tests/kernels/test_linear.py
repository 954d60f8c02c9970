"""The Triton GEMM of aserve/kernels/linear.py against ``F.linear``, with and without split-K.

On a CPU the kernel runs in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from aserve.kernels.linear import LinearLaunch, linear

pytestmark = pytest.mark.slow

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "launch",
    [
        LinearLaunch(block_m=16, block_n=16, block_k=16),
        LinearLaunch(block_m=16, block_n=32, block_k=16, split_k=2),
        LinearLaunch(block_m=32, block_n=16, block_k=32, split_k=3),
        LinearLaunch(block_m=16, block_n=16, block_k=16, split_k=8),  # more splits than K steps: zeros
    ],
)
@pytest.mark.parametrize("m,n,k", [(5, 40, 48), (33, 17, 100), (1, 64, 16)])
def test_linear_matches_f_linear(dtype: torch.dtype, launch: LinearLaunch, m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) * k**-0.5).to(DEVICE, dtype)
    ref = F.linear(x.float(), w.float())
    # A NaN-filled output: every split must store its slice (an empty split its zeros).
    shape = (m, n) if launch.split_k == 1 else (launch.split_k, m, n)
    out = torch.full(shape, float("nan"), device=DEVICE, dtype=dtype if launch.split_k == 1 else torch.float32)
    y = linear(x, w, launch, out)
    if launch.split_k == 1:
        assert y.shape == (m, n) and y.dtype == dtype
        got = y.float()
    else:
        assert y.shape == (launch.split_k, m, n) and y.dtype == torch.float32
        got = y.sum(0)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got, ref, **tol)


def test_linear_writes_into_out_and_takes_strided_rows() -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 64, generator=g).to(DEVICE)[::2, :32]  # 3 rows, each 128 elements after the last
    w = torch.randn(24, 32, generator=g).to(DEVICE)
    out = torch.full((2, 3, 24), float("nan"), device=DEVICE)
    y = linear(x, w, LinearLaunch(block_m=16, block_n=16, block_k=16, split_k=2), out)
    assert y is out
    torch.testing.assert_close(y.sum(0), F.linear(x, w), rtol=1e-4, atol=1e-4)


def test_split_k_launch_gives_every_split_some_k() -> None:
    from aserve.kernels.linear import split_k_launch

    for m, n, k in [(64, 640, 2048), (64, 2048, 8192), (200, 640, 1024), (16, 640, 600), (64, 640, 512)]:
        launch = split_k_launch(m, n, k, torch.bfloat16)
        if launch is not None:
            per = math.ceil(math.ceil(k / launch.split_k) / launch.block_k) * launch.block_k
            assert (launch.split_k - 1) * per < k, (m, n, k, launch)
    assert split_k_launch(16, 640, 600, torch.bfloat16) is None  # 4 splits of 256: the last one empty
    assert split_k_launch(64, 640, 2048, torch.float32) is None  # float32 stays on cuBLAS
    assert split_k_launch(512, 640, 2048, torch.bfloat16) is None

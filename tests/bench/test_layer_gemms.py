"""``aserve.bench.layer_gemms`` runs end to end on a CPU (Triton's interpreter; tiny shapes): its
rows hold cuBLAS's (here torch's) time and each launch's, the add + norm times where the
projection feeds one, and each launch's product agrees with ``F.linear``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from aserve.bench import layer_gemms
from aserve.kernels.linear import LinearLaunch

pytestmark = pytest.mark.slow


def test_layer_gemms_rows_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    launches = [LinearLaunch(16, 16, 32, split_k=1), LinearLaunch(16, 16, 32, split_k=2)]
    # float32: the interpreter's bfloat16 dot is not exact enough to compare
    rows = layer_gemms.time_gemm("tiny-gemma3", "o", 4, launches, device, torch.float32)
    rows += layer_gemms.time_gemm("tiny-llama", "qkv", 4, launches, device, torch.float32)
    assert [r["kernel"] for r in rows] == ["cublas", "triton", "triton"] * 2
    assert all(r["us"] > 0 and "error" not in r for r in rows)
    assert all(("with_norm_us" in r) == (r["gemm"] == "o") for r in rows)
    assert all(r["max_rel_diff"] < 1e-4 for r in rows if r["kernel"] == "triton")
    layer_gemms.table(rows)
    out = capsys.readouterr().out
    assert "tiny-gemma3" in out and "tiny-llama" in out

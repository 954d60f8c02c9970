"""The split-K output and down projections (aserve/kernels/linear.py, ``layers.project``): their
float32 partial products, summed by the fused add + norm kernel, give what cuBLAS's product
gives -- in a layer at the Gemma 3 270M shape in bfloat16 (where ``split_k_launch`` picks the
path itself), and in whole engines (every step's projections forced through it, float32,
tokens equal to cuBLAS's)."""

from __future__ import annotations

import pytest
import torch

from aserve.kernels import linear as linear_mod
from aserve.kernels.linear import LinearLaunch
from aserve.models.layers import GatedMLP, RMSNorm, add_norm, project, set_fused_ops
from tests.workload import cuda_graph_tokens, mixed_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("rows", [64, 200, 256])
def test_split_k_down_projection_into_add_norm_matches_cublas(rows: int) -> None:
    torch.manual_seed(rows)
    mlp = GatedMLP(640, 2048, "gelu_tanh").to("cuda", torch.bfloat16)
    norm, x_norm = RMSNorm(640, 1e-6, gemma=True), RMSNorm(640, 1e-6, gemma=True)
    set_fused_ops(torch.nn.ModuleList([mlp, norm, x_norm]), True)
    norm, x_norm = norm.to("cuda", torch.bfloat16), x_norm.to("cuda", torch.bfloat16)
    with torch.no_grad():
        for p in (*mlp.parameters(), norm.weight, x_norm.weight):
            p.normal_(0.0, 0.05 if p.dim() == 2 else 0.3)
        x = torch.randn(rows, 640, device="cuda", dtype=torch.bfloat16)
        h = torch.randn(rows, 640, device="cuda", dtype=torch.bfloat16) * 4
        partial = mlp(x, partial=True)
        assert partial.dim() == 3 and partial.dtype == torch.float32  # the rule took the split-K path
        plain = mlp(x)
        assert plain.shape == (rows, 640)
        torch.testing.assert_close(partial.sum(0).to(torch.bfloat16), plain, rtol=2e-2, atol=2e-2)
        h1, y1 = add_norm(partial, h, norm, x_norm)
        h0, y0 = add_norm(plain, h, norm, x_norm)
    torch.testing.assert_close(h1, h0, rtol=2e-2, atol=3e-2)
    torch.testing.assert_close(y1, y0, rtol=2e-2, atol=3e-2)


def test_project_keeps_cublas_where_the_rule_says_so() -> None:
    proj = torch.nn.Linear(2048, 2048, bias=False).to("cuda", torch.bfloat16)
    x = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)
    assert linear_mod.split_k_launch(512, 2048, 2048, torch.bfloat16) is None
    assert project(proj, x, partial=True).shape == (512, 2048)
    assert project(proj, x[:64], partial=False).shape == (64, 2048)


@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
def test_engine_tokens_with_split_k_projections(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    path, _ = request.getfixturevalue(model)
    prompts = mixed_prompts(11)

    monkeypatch.setattr(linear_mod, "ON", False)
    without = cuda_graph_tokens(path, prompts)
    calls: list[int] = []
    real_linear = linear_mod.linear

    def counted(*args: object, **kw: object) -> torch.Tensor:
        calls.append(1)
        return real_linear(*args, **kw)  # type: ignore[arg-type]

    # The tiny models' projections (K of 64 and 128) are below the rule's sizes: force a launch.
    monkeypatch.setattr(linear_mod, "split_k_launch", lambda m, n, k, dtype: LinearLaunch(16, 16, 32, split_k=2))
    monkeypatch.setattr(linear_mod, "linear", counted)
    assert cuda_graph_tokens(path, prompts) == without
    assert calls

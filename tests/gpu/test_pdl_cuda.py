"""Kernels launched with programmatic dependent launch (``ASERVE_PDL=1``, aserve/kernels/pdl.py)
wait for the kernel ahead of them before they read or write: an engine gives the same tokens
with it as without (decode graphs, prefills, greedy and seeded sampling; float32, whose GEMMs
do not depend on how arrivals group into steps)."""

from __future__ import annotations

import pytest
import torch

from aserve.kernels import fused, pdl
from tests.workload import cuda_graph_tokens, mixed_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
def test_pdl_gives_the_same_tokens(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    path, _ = request.getfixturevalue(model)
    prompts = mixed_prompts(7)

    launched: list[bool] = []  # the fused norms' launches, with PDL or not

    def args(x: torch.Tensor) -> dict[str, bool]:
        kw = pdl.launch_args(x)
        launched.append(kw["PDL"])
        return kw

    monkeypatch.setattr(fused, "launch_args", args)
    monkeypatch.setattr(pdl, "ON", False)
    without = cuda_graph_tokens(path, prompts)
    assert launched and not any(launched)
    launched.clear()
    monkeypatch.setattr(pdl, "ON", True)
    assert cuda_graph_tokens(path, prompts) == without
    assert launched and all(launched)

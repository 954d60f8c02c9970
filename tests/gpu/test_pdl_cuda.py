"""Kernels launched with programmatic dependent launch (``ASERVE_PDL=1``, aserve/kernels/pdl.py)
wait for the kernel ahead of them before they read or write: an engine gives the same tokens
with it as without (decode graphs, prefills, greedy and seeded sampling; float32, whose GEMMs
do not depend on how arrivals group into steps)."""

from __future__ import annotations

import anyio
import pytest
import torch

import aserve
from aserve.kernels import fused, pdl
from tests.workload import complete_all, mixed_params, mixed_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
def test_pdl_gives_the_same_tokens(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    path, _ = request.getfixturevalue(model)
    prompts = mixed_prompts(7)

    async def run() -> list[list[int]]:
        async with aserve.Engine(model=str(path), device="cuda", dtype="float32", max_running_requests=16,
                                 max_context=256) as engine:  # fmt: skip
            out = await complete_all(engine, prompts, mixed_params)
            assert engine.runner.decode_graphs is not None and engine.runner.decode_graphs.runs > 0
            return out

    launched: list[bool] = []  # the fused norms' launches, with PDL or not

    def args(x: torch.Tensor) -> dict[str, bool]:
        kw = pdl.launch_args(x)
        launched.append(kw["PDL"])
        return kw

    monkeypatch.setattr(fused, "launch_args", args)
    monkeypatch.setattr(pdl, "ON", False)
    without = anyio.run(run)
    assert launched and not any(launched)
    launched.clear()
    monkeypatch.setattr(pdl, "ON", True)
    assert anyio.run(run) == without
    assert launched and all(launched)

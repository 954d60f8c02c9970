"""Variants of the decode step that are settings, each against the default on CUDA: an engine
gives the same tokens (decode graphs, prefills, greedy and seeded sampling; float32) with

* a head-major KV cache (``ASERVE_KV_LAYOUT=head``, ``aserve.kv.pool.kv_tensor``), which the
  engine really holds;
* the decode attention's splits merged by their last program (``ASERVE_DECODE_MERGE=inline``),
  whose arrival counters are back at zero after the run (at most 256 keys a sequence here: two
  splits a (token, KV head))."""

from __future__ import annotations

import anyio
import pytest
import torch

import aserve
from aserve.attention import triton_paged
from tests.workload import complete_all, mixed_params, mixed_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("variant", ["kv_head_major", "inline_merge"])
@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
def test_step_variant_gives_the_same_tokens(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, model: str, variant: str
) -> None:
    path, _ = request.getfixturevalue(model)
    prompts = mixed_prompts(11)

    async def run(on: bool) -> list[list[int]]:
        monkeypatch.setenv("ASERVE_KV_LAYOUT", "head" if on and variant == "kv_head_major" else "token")
        monkeypatch.setattr(triton_paged, "DECODE_MERGE", "inline" if on and variant == "inline_merge" else "kernel")
        async with aserve.Engine(model=str(path), device="cuda", dtype="float32", max_running_requests=16,
                                 max_context=256, attention_backend="triton") as engine:  # fmt: skip
            k0 = engine.runner.pool.kv_cache[0][0]
            head_major = on and variant == "kv_head_major"
            assert engine.runner.pool.layout == ("head" if head_major else "token")
            assert k0.is_contiguous() != head_major
            out = await complete_all(engine, prompts, mixed_params)
            assert engine.runner.decode_graphs is not None and engine.runner.decode_graphs.runs > 0
            return out

    triton_paged._ARRIVALS.clear()
    assert anyio.run(run, True) == anyio.run(run, False)
    if variant == "inline_merge":
        assert triton_paged._ARRIVALS and all((c == 0).all() for c in triton_paged._ARRIVALS.values())

"""The KV cache's memory order (``ASERVE_KV_LAYOUT``, ``aserve.kv.pool.kv_tensor``): an engine
whose cache is head-major gives the same tokens as one whose cache is token-major (decode
graphs, prefills, greedy and seeded sampling; float32), and really holds the other layout."""

from __future__ import annotations

import random

import anyio
import pytest
import torch

import aserve
from tests.workload import complete_all

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
def test_head_major_cache_gives_the_same_tokens(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    path, _ = request.getfixturevalue(model)
    rng = random.Random(11)
    prompts = [[1] + [rng.randrange(3, 384) for _ in range(rng.choice([3, 17, 40, 90]))] for _ in range(21)]

    async def run(layout: str) -> list[list[int]]:
        monkeypatch.setenv("ASERVE_KV_LAYOUT", layout)
        async with aserve.Engine(model=str(path), device="cuda", dtype="float32", max_running_requests=16,
                                 max_context=256, attention_backend="triton") as engine:  # fmt: skip
            k0 = engine.runner.pool.kv_cache[0][0]
            assert engine.runner.pool.layout == layout and k0.is_contiguous() == (layout == "token")
            out = await complete_all(
                engine,
                prompts,
                lambda i: aserve.SamplingParams(
                    max_tokens=12 + 3 * i, temperature=0.8 if i % 3 == 0 else 0, seed=i, ignore_eos=True
                ),
            )
            assert engine.runner.decode_graphs is not None and engine.runner.decode_graphs.runs > 0
            return out

    assert anyio.run(run, "head") == anyio.run(run, "token")

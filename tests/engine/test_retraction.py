"""A KV pool too small for the load: retract the newest request, recompute it later.

No crash, nothing lost or duplicated: the greedy output equals the unconstrained run's.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest

import aserve
from tests.tiny import hf_greedy
from tests.workload import TINY_LLAMA_KV_PER_TOKEN, complete_all


@pytest.mark.parametrize("radix_cache", [True, False])
@pytest.mark.parametrize("overlap", [False, True])
def test_retraction_gives_same_greedy_output(tiny_llama: tuple[Path, Any], overlap: bool, radix_cache: bool) -> None:
    """With the prefix cache on, a retracted request's KV is published rather than freed;
    the retraction loop must evict it again before each fit check (it once retracted
    everyone and ended the oldest request early by "length")."""
    path, hf = tiny_llama
    rng = random.Random(11)
    prompts = [[1] + [rng.randrange(3, 384) for _ in range(rng.randint(5, 30))] for _ in range(12)]
    max_new = 30
    refs = [hf_greedy(hf, p, max_new)[0] for p in prompts]
    per_token = TINY_LLAMA_KV_PER_TOKEN
    params = aserve.SamplingParams(max_tokens=max_new, temperature=0, ignore_eos=True)

    async def run() -> tuple[list[list[int]], aserve.EngineConfig, Any]:
        cfg = aserve.EngineConfig(
            model=str(path), debug=True, warmup=False, overlap=overlap, page_size=4, radix_cache=radix_cache,
            kv_cache_bytes=per_token * 4 * 40,  # 160 tokens for ~12 * 50 demanded
        )  # fmt: skip
        async with aserve.Engine(cfg) as engine:
            out = await complete_all(engine, prompts, params)
            st = engine.stats()
            ledger = engine.ledger()
        assert ledger.all_free and ledger.balanced
        return out, cfg, st

    outs, _, st = anyio.run(run)
    assert st.num_retractions > 0, "the pool was meant to force retraction"
    assert outs == refs

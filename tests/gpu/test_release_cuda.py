"""Engines created and closed one after another in one process each get the same KV pool."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import aserve

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_engine_after_engine_gets_the_same_kv(tiny_gemma: tuple[Path, Any]) -> None:
    path, _ = tiny_gemma
    capacities, leftover = [], []

    async def one() -> int:
        async with aserve.Engine(model=str(path), device="cuda", max_context=256, mem_fraction=0.5) as engine:
            r = await engine.complete([1, 5, 6, 7], aserve.SamplingParams(max_tokens=8, temperature=0))
            assert len(r.token_ids) == 8
            return int(engine.info()["kv_tokens"])

    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()  # what earlier tests in this process left
    for _ in range(5):
        capacities.append(anyio.run(one))
        gc.collect()
        leftover.append(torch.cuda.memory_reserved() - before)
    assert all(abs(c - capacities[0]) <= 0.02 * capacities[0] for c in capacities), capacities
    # Each engine's GiBs of KV went back to the driver, and nothing piles up from one engine to
    # the next: each one's new streams used to leave a 32 MiB cuBLAS workspace behind (H100
    # host: 945, 979, 1013, 1046, 1080 MB reserved after each). Later engines now take the
    # closed ones' streams (aserve/device/streams.py), so their workspaces too.
    assert max(leftover) < 2**28, leftover
    assert leftover[-1] - leftover[0] < 2**24, leftover

"""A closed engine keeps nothing of its device state alive: weights, KV, table, FutureMap,
decode-graph buffers (the GPU figure is tests/gpu/test_release_cuda.py)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import anyio
import torch

import aserve


def test_closed_engine_drops_every_device_tensor(tiny_gemma: tuple[Path, Any]) -> None:
    path, _ = tiny_gemma
    refs: list[weakref.ref[torch.Tensor]] = []

    async def run() -> aserve.Engine:
        # cuda_graph=True on a CPU runs the graphs' static buffers uncaptured.
        engine = aserve.Engine(model=str(path), device="cpu", max_context=64, kv_cache_bytes=2**22,
                               max_running_requests=4, attention_backend="triton", cuda_graph=True)  # fmt: skip
        async with engine:
            r = await engine.complete([1, 5, 6, 7], aserve.SamplingParams(max_tokens=6, temperature=0))
            assert len(r.token_ids) == 6
            pool, graphs, xgraphs = engine._require().pool, engine.runner.decode_graphs, engine.runner.extend_graphs
            assert graphs is not None and graphs.runs > 0 and xgraphs is not None and xgraphs.runs > 0
            tensors = [*engine._require().model.parameters(), *engine._require().model.buffers()]
            tensors += [t for kv in pool.kv_cache for t in kv] + [pool.table_device]
            tensors += [engine.future_map.tokens, engine.future_map.generations]
            tensors += [s.inputs for s in graphs._static.values()]
            tensors += [s.inputs for s in xgraphs._static.values()] + [xgraphs.logits]
            refs.extend(weakref.ref(t) for t in tensors)
            del tensors, pool, graphs, xgraphs
        return engine  # the caller keeps the closed engine

    engine = anyio.run(run)
    gc.collect()
    alive = [ref() for ref in refs if ref() is not None]
    assert not alive, f"{len(alive)} of {len(refs)} device tensors outlive the closed engine"
    # What the host keeps stays readable.
    assert engine.ledger().balanced
    assert engine.stats().output_tokens >= 6  # warm-up included
    assert engine.info()["kv_tokens"] > 0

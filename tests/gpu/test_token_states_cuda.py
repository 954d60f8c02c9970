"""The four token states on CUDA: each awaitable (``materialized`` included, which has no
waiter thread), resolved once and in order, with the defaults (CUDA graphs, depth 3) and the
eager path; and the trace draws each step's device span and states on CUDA."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import aserve
from tests.engine.test_token_states import assert_in_order, check_states

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("opts", [{}, {"cuda_graph": False}], ids=["defaults", "eager"])
def test_states_resolve_in_order_on_cuda(tiny_llama: tuple[Path, Any], opts: dict[str, Any], tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"

    async def run() -> tuple[list[dict[str, Any]], int]:
        async with aserve.Engine(model=str(tiny_llama[0]), device="cuda", max_context=128, kv_cache_bytes=2**26,
                                 debug=True, trace_path=str(trace), **opts) as engine:  # fmt: skip
            engine.reset_stats()
            rows = await check_states(engine, num_requests=8, max_tokens=12)
            return rows, engine.stats().num_steps

    rows, num_steps = anyio.run(run)
    assert_in_order(rows)
    for row in rows:
        step = row["step"]
        assert step.materialized.cuda_event is not None and step.materialized.done()
    events = json.loads(trace.read_text())["traceEvents"]
    device = [ev for ev in events if ev.get("ph") == "X" and ev.get("tid") == 2]
    states = {ev["name"] for ev in events if ev.get("cat") == "token states"}
    assert len(device) >= num_steps and all(ev["dur"] > 0 for ev in device)
    assert states == {"planned", "in-flight", "materialized", "committed"}

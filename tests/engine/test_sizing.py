"""Batch sizes sized from the device, and the decode-graph ladder they set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import aserve
from aserve.device.decode_graphs import ladder
from aserve.scheduler.sizing import GIB, choose_batch_sizes


def test_cpu_keeps_the_small_sizes() -> None:
    s = choose_batch_sizes("cpu", None, kv_tokens=10**6)
    assert (s.max_running_requests, s.max_num_batched_tokens) == (64, 2048)
    assert "CPU default" in s.why


@pytest.mark.parametrize(
    ("memory_gib", "kv_tokens", "running", "batched"),
    [
        (141, 4_000_000, 256, 8192),  # H200, a small model: memory caps the batch
        (80, 600_000, 256, 8192),
        (40, 2_000_000, 128, 4096),
        (16, 1_000_000, 64, 2048),
        (141, 100_000, 96, 8192),  # a big model leaves little KV: 100k // 1024 = 97 -> 96
        (24, 5_000, 16, 4096),  # KV for 4 requests at 1024 each: the floor of 16
    ],
)
def test_cuda_sizes_follow_memory_and_kv(memory_gib: int, kv_tokens: int, running: int, batched: int) -> None:
    s = choose_batch_sizes("cuda", memory_gib * GIB, kv_tokens)
    assert (s.max_running_requests, s.max_num_batched_tokens) == (running, batched)
    assert s.max_running_requests % 8 == 0
    assert str(running) in s.why and str(batched) in s.why


def test_given_sizes_win() -> None:
    s = choose_batch_sizes("cuda", 141 * GIB, 4_000_000, max_running_requests=12, max_num_batched_tokens=300)
    assert (s.max_running_requests, s.max_num_batched_tokens) == (12, 300)


@pytest.mark.parametrize("top", [1, 3, 16, 64, 100, 256, 512])
def test_ladder_pads_each_batch_to_the_next_rung(top: int) -> None:
    rungs = ladder(top)
    assert rungs == sorted(set(rungs)) and rungs[0] == 1 and rungs[-1] == top
    for b in range(1, top + 1):
        pad = min(r for r in rungs if r >= b)
        assert pad - b <= (15 if b <= 256 else 31)


def test_engine_reports_the_resolved_sizes(tiny_llama: tuple[Path, Any]) -> None:
    path, _ = tiny_llama

    async def run() -> tuple[dict[str, Any], Any]:
        async with aserve.Engine(model=str(path), device="cpu", max_context=64, kv_cache_bytes=2**22) as engine:
            r = await engine.complete([1, 5, 6], aserve.SamplingParams(max_tokens=3, temperature=0))
            assert len(r.token_ids) == 3
            return engine.info(), engine.config

    info, cfg = anyio.run(run)
    assert (info["max_running_requests"], info["max_num_batched_tokens"]) == (64, 2048)
    assert (cfg.max_running_requests, cfg.max_num_batched_tokens) == (64, 2048)

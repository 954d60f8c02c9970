"""Prefix reuse through the engine: same outputs with the cache on and off, in both modes.

Debug mode is on everywhere: the engine then tracks the KV pages every step in flight
reads and writes, and asserts that nothing in flight is evicted and nothing still being
written is published.
"""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aserve
from aserve.device.forward import StepForward
from tests.workload import TINY_LLAMA_KV_PER_TOKEN, Job, run_jobs

PER_TOKEN = TINY_LLAMA_KV_PER_TOKEN


def _shared_prefix_jobs(seed: int, groups: int, per_group: int, prefix_len: int) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    for g in range(groups):
        system = [1] + [rng.randrange(3, 384) for _ in range(prefix_len)]
        for i in range(per_group):
            question = [rng.randrange(3, 384) for _ in range(rng.randint(1, 20))]
            sampled = i % 2 == 1
            params = aserve.SamplingParams(
                max_tokens=rng.choice([1, 6, 16]),
                temperature=0.9 if sampled else 0.0,
                seed=1000 * g + i if sampled else None,
                ignore_eos=True,
            )
            jobs.append(Job(system + question, params, delay=rng.random() * 0.05))
    return jobs


async def _run(path: Path, jobs: list[Job], **cfg: Any) -> tuple[list[tuple[Any, ...]], aserve.EngineStats]:
    async with aserve.Engine(model=str(path), debug=True, warmup=False, page_size=4, **cfg) as engine:
        out = await run_jobs(engine, jobs)
        ledger = engine.ledger()
        assert ledger.balanced and ledger.cached_pages * 4 == engine.stats().cached_tokens
        stats = engine.stats()
        if cfg.get("radix_cache", True):
            assert engine.flush_cache() == stats.cached_tokens
            assert engine.ledger().free_pages == ledger.total_pages
    return out, stats


@pytest.mark.parametrize("overlap", [False, True])
def test_same_outputs_cache_on_and_off(eos_llama: tuple[Path, Any], overlap: bool) -> None:
    jobs = _shared_prefix_jobs(seed=1, groups=3, per_group=6, prefix_len=37)
    common = {"overlap": overlap, "max_num_batched_tokens": 24}  # chunked prefills
    off, st_off = anyio.run(lambda: _run(eos_llama[0], jobs, radix_cache=False, **common))
    on, st_on = anyio.run(lambda: _run(eos_llama[0], jobs, radix_cache=True, **common))
    assert on == off
    assert st_off.cache_hit_tokens == 0
    assert st_on.cache_hit_tokens > 0
    assert st_on.prefill_tokens_computed == st_off.prefill_tokens_computed - st_on.cache_hit_tokens


def test_prefill_tokens_computed_drop_by_the_shared_prefix(tiny_llama: tuple[Path, Any]) -> None:
    """Sequential requests over one 40-token system prompt: every request after the first
    reuses its 10 full pages (40 tokens) and computes only the rest."""
    rng = random.Random(3)
    system = [1] + [rng.randrange(3, 384) for _ in range(39)]  # exactly 10 pages of 4
    prompts = [system + [rng.randrange(3, 384) for _ in range(7)] for _ in range(5)]
    params = aserve.SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)

    async def run(cache: bool) -> tuple[list[list[int]], aserve.EngineStats]:
        async with aserve.Engine(model=str(tiny_llama[0]), page_size=4, warmup=False, radix_cache=cache) as engine:
            results = [await engine.complete(p, params) for p in prompts]
            cached[cache] = [r.usage.cached_tokens for r in results]
            stats = engine.stats()
            # A stream reports the same figure once admitted.
            stream = engine.open_stream([*system, 5, 6], params)
            async with contextlib.aclosing(stream):
                tokens = [t async for d in stream for t in d.token_ids]
            assert tokens == (await engine.complete([*system, 5, 6], params)).token_ids
            cached[cache].append(stream.cached_tokens)
            return [r.token_ids for r in results], stats

    cached: dict[bool, list[int]] = {}
    outs_off, off = anyio.run(run, False)
    outs_on, on = anyio.run(run, True)
    assert outs_on == outs_off
    # Per request: nothing cached for the first; the system prompt's 10 pages for every later one.
    assert cached == {False: [0] * 6, True: [0, 40, 40, 40, 40, 40]}
    assert off.prefill_tokens_computed == 5 * 47
    assert on.cache_hit_tokens == 4 * 40
    assert on.prefill_tokens_computed == 5 * 47 - 4 * 40
    assert on.cache_hit_rate == pytest.approx(160 / 235)


@st.composite
def prefix_workloads(draw: st.DrawFn) -> list[Job]:
    prefixes = [
        [1, *draw(st.lists(st.integers(3, 383), min_size=0, max_size=30))] for _ in range(draw(st.integers(1, 3)))
    ]
    jobs = []
    for _ in range(draw(st.integers(2, 12))):
        base = draw(st.sampled_from(prefixes))
        cut = draw(st.integers(1, len(base)))
        tail = draw(st.lists(st.integers(3, 383), min_size=0, max_size=12))
        sampled = draw(st.booleans())
        params = aserve.SamplingParams(
            max_tokens=draw(st.sampled_from([1, 3, 9, 20])),
            temperature=0.8 if sampled else 0.0,
            seed=draw(st.integers(0, 2**31)) if sampled else None,
            stop_token_ids=draw(st.sampled_from([(), (base[-1],)])),
        )
        abort_after = draw(st.one_of(st.none(), st.none(), st.integers(0, 3)))
        jobs.append(Job(base[:cut] + tail, params, draw(st.floats(0, 0.03)), abort_after))
    return jobs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=prefix_workloads(), overlap=st.booleans(), pool_pages=st.sampled_from([20, 40, 400]))
def test_property_cache_on_off(eos_llama: tuple[Path, Any], jobs: list[Job], overlap: bool, pool_pages: int) -> None:
    """Random shared prefixes, chunked prefills, aborts, and pools small enough to force
    eviction and retraction: every request that was not aborted gets the same tokens and
    finish reason with the cache on as with it off (EOS endings come from the boosted EOS)."""
    cfg = {"overlap": overlap, "max_num_batched_tokens": 16, "kv_cache_bytes": PER_TOKEN * 4 * pool_pages}
    off, _ = anyio.run(lambda: _run(eos_llama[0], jobs, radix_cache=False, **cfg))
    on, _ = anyio.run(lambda: _run(eos_llama[0], jobs, radix_cache=True, **cfg))
    for i, (a, b) in enumerate(zip(off, on)):
        if a == ("aborted",) or b == ("aborted",):
            continue
        assert a == b, f"job {i}: cache off {a} != cache on {b}"


def test_nothing_in_flight_is_evicted_or_published_early(
    tiny_llama: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delay between launch and commit keeps steps in flight long; with a pool small
    enough to evict constantly, the engine's debug checks (see module docstring) must
    never fire, and outputs still equal the cache-off run."""
    real_work = StepForward.run

    def slow_work(self: StepForward, dev: Any) -> Any:
        time.sleep(0.004)
        return real_work(self, dev)

    monkeypatch.setattr(StepForward, "run", slow_work)
    jobs = _shared_prefix_jobs(seed=9, groups=4, per_group=5, prefix_len=29)
    cfg = {"overlap": True, "max_num_batched_tokens": 20, "kv_cache_bytes": PER_TOKEN * 4 * 48}
    off, _ = anyio.run(lambda: _run(tiny_llama[0], jobs, radix_cache=False, **cfg))
    on, st_on = anyio.run(lambda: _run(tiny_llama[0], jobs, radix_cache=True, **cfg))
    assert on == off
    assert st_on.cache_hit_tokens > 0 and st_on.cache_evicted_tokens > 0

"""A single request whose context outgrows the whole KV pool must end, not hang.

``Scheduler._retract_until_fits`` puts the lone request on ``Scheduler.stuck`` and
``schedule()`` returns ``Blocked.IDLE``; the planner then sleeps on ``Engine._work`` without
calling ``_end_stuck`` again, and nothing in flight will ever set ``_work``. The request never
finishes and its pages are never freed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import aserve
from tests.workload import TINY_LLAMA_KV_PER_TOKEN

PER_TOKEN = TINY_LLAMA_KV_PER_TOKEN


@pytest.mark.parametrize("overlap", [False, True])
def test_request_larger_than_pool_ends_instead_of_hanging(tiny_llama: tuple[Path, Any], overlap: bool) -> None:
    path, _ = tiny_llama
    params = aserve.SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)

    async def run() -> tuple[Any, Any]:
        cfg = aserve.EngineConfig(
            model=str(path), debug=True, warmup=False, overlap=overlap, page_size=4,
            kv_cache_bytes=PER_TOKEN * 4 * 10,  # 40 tokens of KV; max_context is 512
        )  # fmt: skip
        async with aserve.Engine(cfg) as engine:
            with anyio.fail_after(10):
                res = await engine.complete([1, *list(range(3, 12))], params)
            ledger = engine.ledger()
        return res, ledger

    res, ledger = anyio.run(run)
    assert res.finish_reason == "length"
    assert 0 < len(res.token_ids) <= 31
    assert ledger.all_free and ledger.balanced


@pytest.mark.parametrize("overlap", [False, True])
def test_a_request_that_outgrows_the_pool_ends_with_a_typed_error(
    tiny_llama: tuple[Path, Any], overlap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admission clips max_tokens to the pool, so only a request that outgrows it anyway can be
    stuck; here the length limit is switched off so it does. It must end with KVCapacityError
    (not a "length" finish that looks like success), other requests unaffected, KV all back.
    (It decodes outside the decode batch, whose columns hold the limit itself: there each step
    asks ``Req.length_reached``.)"""
    import aserve.scheduler.decode_batch as decode_batch
    from aserve.scheduler.req import Req

    path, _ = tiny_llama
    runaway = aserve.SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, seed=99)
    real = Req.length_reached
    monkeypatch.setattr(Req, "length_reached", lambda self, n: False if self.params is runaway else real(self, n))
    plain = decode_batch.is_plain
    monkeypatch.setattr(decode_batch, "is_plain", lambda r: r.params is not runaway and plain(r))

    async def run() -> tuple[BaseException | None, Any, Any]:
        cfg = aserve.EngineConfig(
            model=str(path), debug=True, warmup=False, overlap=overlap, page_size=4,
            kv_cache_bytes=PER_TOKEN * 4 * 10,  # 40 tokens of KV; max_context is 512
        )  # fmt: skip
        err: BaseException | None = None
        async with aserve.Engine(cfg) as engine:
            with anyio.fail_after(20):
                try:
                    await engine.complete([1, 3, 4, 5], runaway)
                except aserve.KVCapacityError as exc:
                    err = exc
                other = await engine.complete([1, 6, 7], aserve.SamplingParams(max_tokens=5, temperature=0))
            ledger = engine.ledger()
        return err, other, ledger

    err, other, ledger = anyio.run(run)
    assert isinstance(err, aserve.KVCapacityError) and "max_tokens" in str(err)
    assert other.finish_reason == "length" and len(other.token_ids) == 5
    assert ledger.all_free and ledger.balanced


def test_max_context_is_what_the_pool_holds(tiny_llama: tuple[Path, Any]) -> None:
    """A pool smaller than the model's context lowers the context every caller sees (the
    server's max_model_len, its prompt + max_tokens check) instead of ending requests early."""
    path, _ = tiny_llama

    async def run() -> tuple[int, dict[str, Any]]:
        cfg = aserve.EngineConfig(model=str(path), warmup=False, page_size=4, kv_cache_bytes=PER_TOKEN * 4 * 10)
        async with aserve.Engine(cfg) as engine:
            return engine.max_context, engine.info()

    ctx, info = anyio.run(run)
    assert ctx == info["kv_tokens"] == 40 and info["full_context_requests_that_fit"] == 1

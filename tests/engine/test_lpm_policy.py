"""Longest-prefix-first admission: cached prefixes first when the queue is long, nobody starves."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import torch

import aserve
from aserve.kv.pool import KVPool
from aserve.models.config import ModelConfig
from aserve.sampling_params import SamplingParams
from aserve.scheduler.plan import Plan, SchedulerConfig
from aserve.scheduler.policy import Scheduler
from aserve.scheduler.req import Req


def test_cached_prefix_requests_go_first(tiny_llama: tuple[Path, Any]) -> None:
    rng = random.Random(0)
    shared = [1] + [rng.randrange(3, 384) for _ in range(31)]  # 8 pages of 4
    a = [shared + [rng.randrange(3, 384) for _ in range(3)] for _ in range(2)]
    b = [[1] + [rng.randrange(3, 384) for _ in range(34)] for _ in range(4)]
    arrivals = [("b0", b[0]), ("b1", b[1]), ("a0", a[0]), ("b2", b[2]), ("a1", a[1]), ("b3", b[3])]
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)

    async def run(policy: str) -> list[str]:
        done: list[str] = []
        async with aserve.Engine(
            model=str(tiny_llama[0]), page_size=4, warmup=False, max_running_requests=1, schedule_policy=policy
        ) as engine:
            await engine.complete([*shared, 7], params)  # caches the shared prefix
            blocker = [1] + [5] * 40  # occupies the single running slot while the queue fills

            async def one(name: str, prompt: list[int]) -> None:
                await engine.complete(prompt, params)
                done.append(name)

            async with anyio.create_task_group() as tg:
                tg.start_soon(engine.complete, blocker, SamplingParams(max_tokens=150, ignore_eos=True))
                await anyio.sleep(0.02)  # the blocker is admitted and decoding
                for name, prompt in arrivals:
                    tg.start_soon(one, name, prompt)
                    await anyio.lowlevel.checkpoint()  # keep arrival order
        return done

    assert anyio.run(run, "fcfs") == ["b0", "b1", "a0", "b2", "a1", "b3"]
    assert anyio.run(run, "lpm") == ["a0", "a1", "b0", "b1", "b2", "b3"]


def _scheduler(max_skips: int) -> Scheduler:
    cfg = ModelConfig(
        architecture="llama", vocab_size=64, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
        num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=256, rope_theta=1e4,
    )  # fmt: skip
    pool = KVPool(
        cfg, num_pages=64, page_size=4, num_rows=4, max_context=256, dtype=torch.float32, device=torch.device("cpu")
    )
    sc = SchedulerConfig(max_running_requests=1, schedule_policy="lpm", lpm_min_queue=2, lpm_max_skips=max_skips)
    return Scheduler(pool, sc)


def _req(name: str, prompt: list[int]) -> Req:
    return Req(rid=name, index=0, prompt_ids=prompt, params=SamplingParams(max_tokens=1), max_new_tokens=1, seed=0,
               stop_ids=frozenset())  # fmt: skip


def test_no_starvation_under_a_stream_of_cache_hits() -> None:
    """Plain scheduler, no device: a request without a cache hit is admitted after being
    passed over ``lpm_max_skips`` times, although cache hits keep arriving."""
    sched = _scheduler(max_skips=3)
    hot = list(range(1, 17))  # 4 pages
    sched.prefix.publish(_seed_req(sched, hot), 16)
    cold = _req("cold", [40, 41, 42, 43, 44])
    sched.add(cold)
    order = []
    for i in range(8):
        sched.add(_req(f"hot{i}", [*hot, 50 + i]))
        plan = sched.schedule(pipeline_busy=False)
        assert isinstance(plan, Plan)
        (seq,) = plan.seqs
        order.append(seq.req.rid)
        seq.req.finish_reason = "length"
        sched.release_if_done(seq.req)
    assert order.index("cold") == 3  # skipped three times, then admitted


def _seed_req(sched: Scheduler, tokens: list[int]) -> Req:
    """A request that 'computed' ``tokens`` so its pages can be published into the tree."""
    r = _req("seed", tokens)
    r.row = sched.pool.rows.alloc()
    sched.pool.grow(r.pages, 0, len(tokens))
    r.num_computed = len(tokens)
    return r

"""Shared test workloads: jobs that stream (and maybe abort), and batches of ``complete`` calls."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

import aserve

# KV bytes per token of tests.tiny's Llama: layers * (K, V) * kv heads * head_dim * float32.
TINY_LLAMA_KV_PER_TOKEN = 2 * 2 * 2 * 16 * 4


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    params: aserve.SamplingParams
    delay: float = 0.0
    abort_after: int | None = None  # leave the stream after this many deltas (None: read to the end)


async def run_job(engine: aserve.Engine, job: Job) -> tuple[Any, ...]:
    """Stream ``job`` after its delay: ``(ids, finish_reason, text)``, or ``("aborted",)``."""
    await anyio.sleep(job.delay)
    ids: list[int] = []
    text: list[str] = []
    finish = None
    n = 0
    async for d in engine.generate(job.prompt, job.params):
        assert finish is None, "a delta arrived after the finishing delta"
        ids += d.token_ids
        text.append(d.text)
        finish = d.finish_reason
        n += 1
        if job.abort_after is not None and n > job.abort_after:
            break
    return (tuple(ids), finish, "".join(text)) if finish is not None else ("aborted",)


async def run_jobs(engine: aserve.Engine, jobs: Sequence[Job]) -> list[tuple[Any, ...]]:
    """Every job concurrently; then wait (bounded) until every request's KV is back."""
    out: list[tuple[Any, ...]] = [()] * len(jobs)

    async def one(i: int) -> None:
        out[i] = await run_job(engine, jobs[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(jobs)):
            tg.start_soon(one, i)
    with anyio.fail_after(10):
        while not engine.ledger().all_free:
            await anyio.sleep(0.005)
    return out


async def complete_all(
    engine: aserve.Engine,
    prompts: Sequence[list[int]],
    params: aserve.SamplingParams | Callable[[int], aserve.SamplingParams],
) -> list[list[int]]:
    """``engine.complete`` for every prompt concurrently; the token ids in prompt order."""
    out: dict[int, list[int]] = {}

    async def one(i: int) -> None:
        p = params(i) if callable(params) else params
        out[i] = (await engine.complete(prompts[i], p)).token_ids

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return [out[i] for i in range(len(prompts))]


def cuda_graph_tokens(path: Any, prompts: Sequence[list[int]]) -> list[list[int]]:
    """A float32 CUDA engine on ``path``'s model: every prompt with ``mixed_params``, all at
    once (decode graphs on; asserted to have run), in prompt order. For engine-equality tests
    of a kernel setting (its tokens with the setting against without)."""

    async def run() -> list[list[int]]:
        async with aserve.Engine(model=str(path), device="cuda", dtype="float32", max_running_requests=16,
                                 max_context=256) as engine:  # fmt: skip
            out = await complete_all(engine, prompts, mixed_params)
            assert engine.runner.decode_graphs is not None and engine.runner.decode_graphs.runs > 0
            return out

    return anyio.run(run)


async def complete_each(engine: aserve.Engine, prompts: list[list[int]], params: aserve.SamplingParams) -> list[Any]:
    """Each prompt's result, or the exception it raised (anything but cancellation), all at once."""
    out: list[Any] = [None] * len(prompts)

    async def one(i: int) -> None:
        try:
            out[i] = await engine.complete(prompts[i], params)
        except Exception as exc:
            out[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return out


def mixed_prompts(seed: int, n: int = 21) -> list[list[int]]:
    """``n`` prompts of 4 to 91 tokens (ids 3..383, after a 1), for engine-equality tests."""
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 384) for _ in range(rng.choice([3, 17, 40, 90]))] for _ in range(n)]


def mixed_params(i: int) -> aserve.SamplingParams:
    """Request ``i``'s params in the engine-equality tests: lengths 12 + 3i, every third
    sampled (seeded), the rest greedy."""
    return aserve.SamplingParams(max_tokens=12 + 3 * i, temperature=0.8 if i % 3 == 0 else 0, seed=i, ignore_eos=True)

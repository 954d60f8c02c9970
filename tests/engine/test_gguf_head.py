"""``gguf_head="int8"`` and ``gguf_prefill="bfloat16"`` through the engine on the default model (the
kernels: tests/kernels/test_q8_0_int8.py, tests/kernels/test_gguf_linear.py)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

import aserve
from aserve.errors import InvalidRequestError
from aserve.kernels import gguf_linear

pytestmark = pytest.mark.skipif(gguf_linear.kernel() is None, reason="GGUF CPU kernel not built")

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    return", "Once upon a time"]


async def _greedy(**kwargs: object) -> tuple[str, list[list[int]]]:
    params = aserve.SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    async with aserve.Engine(model="gemma-3-270m", warmup=False, **kwargs) as engine:  # type: ignore[arg-type]
        batch = await engine.complete_many(PROMPTS, params)
        return engine.info()["weights"], [o.token_ids for o in sorted(batch.outputs, key=lambda o: o.index)]


async def test_int8_head_runs_and_overlap_equals_serial() -> None:
    weights, overlap = await _greedy(gguf_head="int8")
    assert "LM head int8" in weights
    _, serial = await _greedy(gguf_head="int8", overlap=False)
    assert overlap == serial


async def test_int8_head_needs_gguf_blocks() -> None:
    with pytest.raises(InvalidRequestError, match="gguf_head"):
        async with aserve.Engine(model="gemma-3-270m", dtype="float32", gguf_head="int8", warmup=False):
            pass
    with pytest.raises(InvalidRequestError, match="gguf_head"):
        aserve.EngineConfig(gguf_head="int4")  # type: ignore[arg-type]


async def test_the_default_head_takes_int8_where_the_cpu_has_vnni() -> None:
    kernel = gguf_linear.kernel()
    assert kernel is not None
    async with aserve.Engine(model="gemma-3-270m", warmup=False) as engine:
        assert ("LM head int8 (vnni)" in engine.info()["weights"]) == (kernel.i8_isa() == "vnni")
    async with aserve.Engine(model="gemma-3-270m", gguf_head="float32", warmup=False) as engine:
        assert "LM head int8" not in engine.info()["weights"]


async def test_bf16_prefill_default_follows_the_cpu_and_overlap_equals_serial() -> None:
    kernel = gguf_linear.kernel()
    assert kernel is not None
    async with aserve.Engine(model="gemma-3-270m", warmup=False) as engine:
        assert ("bfloat16 matmuls in prefills" in engine.info()["weights"]) == bool(kernel.has_bf16())
    # Prompts of 40+ tokens: their prefill takes the bfloat16 matmuls.
    long = [p * 8 for p in PROMPTS]
    params = aserve.SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    outs = []
    for overlap in (True, False):
        async with aserve.Engine(model="gemma-3-270m", gguf_prefill="bfloat16", overlap=overlap, warmup=False) as e:
            assert "bfloat16 matmuls in prefills" in e.info()["weights"]
            batch = await e.complete_many(long, params)
            assert batch.usage.prompt_tokens >= 3 * 32
            outs.append([o.token_ids for o in sorted(batch.outputs, key=lambda o: o.index)])
    assert outs[0] == outs[1]
    with pytest.raises(InvalidRequestError, match="gguf_prefill"):
        async with aserve.Engine(model="gemma-3-270m", dtype="float32", gguf_prefill="bfloat16", warmup=False):
            pass


async def test_greedy_steps_take_the_heads_argmax_and_the_same_tokens() -> None:
    """A plain greedy step on the int8 head asks the kernel for the argmax alone (no logits
    written); a request that wants logprobs needs the logits and takes the sampler. Each
    request is alone in its engine, so the steps are the same and so must be the tokens."""
    calls = 0
    real = gguf_linear.q8_0x16_argmax_int8

    def counted(*args: object) -> object:
        nonlocal calls
        calls += 1
        return real(*args)  # type: ignore[arg-type]

    params = aserve.SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf_linear, "q8_0x16_argmax_int8", counted)
        async with aserve.Engine(model="gemma-3-270m", gguf_head="int8", warmup=False) as engine:
            plain = await engine.complete(PROMPTS[0], params)
            assert calls >= 12
            seen = calls
            with_logprobs = await engine.complete(PROMPTS[0], dataclasses.replace(params, logprobs=1))
            assert calls == seen
    assert plain.token_ids == with_logprobs.token_ids


async def test_top_k_steps_sample_from_the_heads_candidates_and_draw_the_same_tokens() -> None:
    """Seeded top-k requests (with a greedy one beside them) on the int8 head: their decode
    steps sample from the kernel's candidates alone (no logits written); the same requests
    asking for logprobs need the logits and take the full sampler. The draws are keyed by
    seed, step and token id, so both give the same tokens."""
    top_k = [aserve.SamplingParams(max_tokens=16, temperature=t, top_k=k, seed=s, ignore_eos=True)
             for t, k, s in ((1.0, 40, 1), (0.7, 5, 2), (1.5, 100, 3))]  # fmt: skip
    greedy = aserve.SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)

    async def run(logprobs: int | None) -> tuple[list[list[int]], int]:
        params = [dataclasses.replace(q, logprobs=logprobs) for q in (*top_k, greedy)]
        async with aserve.Engine(model="gemma-3-270m", gguf_head="int8", warmup=False) as engine:
            alone = [await engine.complete(PROMPTS[i % 3], q) for i, q in enumerate(params[:3])]
            together = await asyncio.gather(*(engine.complete(PROMPTS[i % 3], q) for i, q in enumerate(params)))
            return [o.token_ids for o in (*alone, *together)], engine.runner.candidate_steps

    candidates, steps = await run(None)
    assert steps >= 3 * 15 + 15  # the decode steps of the runs alone and of the batch
    full, no_steps = await run(0)
    assert no_steps == 0
    assert candidates == full


async def test_a_step_whose_candidates_may_miss_a_tie_samples_from_the_full_logits() -> None:
    """Where ``sample_candidates`` cannot vouch for a row (a tie past the candidates: made to
    happen at every step here), the runner hands the step's full logits to the sampler: the
    same seeded tokens, every such step counted."""
    from aserve.device import forward as forward_mod

    params = aserve.SamplingParams(max_tokens=12, temperature=1.0, top_k=20, seed=5, ignore_eos=True)

    async def run() -> tuple[list[int], int, int]:
        async with aserve.Engine(model="gemma-3-270m", gguf_head="int8", warmup=False) as engine:
            out = await engine.complete(PROMPTS[1], params)
            return out.token_ids, engine.runner.candidate_steps, engine.runner.candidate_fallbacks

    tokens, steps, fallbacks = await run()
    assert steps >= 11 and fallbacks == 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(forward_mod, "sample_candidates", lambda *args: None)
        tied, steps, fallbacks = await run()
    assert steps == 0 and fallbacks >= 11
    assert tied == tokens

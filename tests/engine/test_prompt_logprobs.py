"""Prompt logprobs (``SamplingParams.prompt_logprobs``, the server's echo + logprobs) against
transformers' log_softmax on a tiny random Gemma 3: chunked prefill across several steps,
with a cached prefix of the same prompt present, and after a list of prompts."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import aserve


def _reference(hf: Any, prompt: list[int], k: int) -> list[tuple[float, list[int]]]:
    """(logprob of prompt token j, top-k ids at position j - 1) for j >= 1."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0].float()
    lsm = torch.log_softmax(logits, dim=-1)
    return [(float(lsm[j - 1, prompt[j]]), lsm[j - 1].topk(k).indices.tolist()) for j in range(1, len(prompt))]


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                  reason="needs CUDA")])]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_prompt_logprobs_match_transformers(tiny_gemma: tuple[Path, Any], device: str) -> None:
    """On CUDA (float32, the Triton kernels and decode graphs) as on the CPU."""
    path, hf = tiny_gemma
    rng = random.Random(0)
    prompts = [[1] + [rng.randrange(3, 384) for _ in range(n)] for n in (40, 9, 0)]
    k = 3
    params = aserve.SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=k, logprobs=1)

    async def run() -> list[aserve.CompletionResult]:
        # 16 tokens per step: the 41-token prompt is prefilled in three chunks.
        async with aserve.Engine(model=str(path), device=device, dtype="float32", warmup=False, debug=True,
                                 max_num_batched_tokens=16) as engine:  # fmt: skip
            # The first request leaves the long prompt's prefix in the cache; the second must
            # not read it (a cached page has no logits) and still match.
            plain = await engine.complete(prompts[0], aserve.SamplingParams(max_tokens=2, temperature=0))
            assert plain.usage.prompt_tokens == len(prompts[0])
            out = [await engine.complete(prompts[0], params)]
            out.append(await engine.complete_many(prompts[1:], params))
            ledger = engine.ledger()
            assert ledger.balanced, ledger
            return out

    single, many = anyio.run(run)
    assert single.usage.cached_tokens == 0
    assert single.token_ids == plain_tokens(hf, prompts[0])
    results = [single.outputs[0], *many.outputs]
    assert [o.index for o in many.outputs] == [0, 1]
    assert many.usage.prompt_tokens == len(prompts[1]) + len(prompts[2])
    for prompt, out in zip(prompts, results, strict=True):
        got = out.prompt_logprobs
        assert got is not None and len(got) == len(prompt) and got[0] is None
        ref = _reference(hf, prompt, k)
        for j, (lp, (ref_lp, ref_top)) in enumerate(zip(got[1:], ref, strict=True), start=1):
            assert lp is not None and lp.token_id == prompt[j]
            assert abs(lp.logprob - ref_lp) < 1e-3, (j, lp.logprob, ref_lp)
            assert [t for t, _ in lp.top] == ref_top, j


def plain_tokens(hf: Any, prompt: list[int]) -> list[int]:
    from tests.tiny import hf_greedy

    ids, _ = hf_greedy(hf, prompt, 2)
    return list(ids)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
def test_max_tokens_zero_only_prefills(tiny_gemma: tuple[Path, Any], overlap: bool) -> None:
    """max_tokens 0 (OpenAI's echo-only request): the prompt's logprobs, no output token,
    finish "length", the KV ledger back to free, overlap and serial alike; streamed and
    whole, for several prompts at once (one of a single token, one prefilled in chunks),
    beside a request that generates, and from a prompt the prefix cache holds."""
    path, hf = tiny_gemma
    rng = random.Random(1)
    prompts = [[1] + [rng.randrange(3, 384) for _ in range(n)] for n in (40, 9, 0)]
    k = 2
    zero = aserve.SamplingParams(max_tokens=0, prompt_logprobs=k)

    async def run() -> tuple[list[aserve.CompletionResult], list[list[aserve.Delta]], aserve.CompletionResult]:
        async with aserve.Engine(model=str(path), device="cpu", dtype="float32", warmup=False, debug=True,
                                 max_num_batched_tokens=16, overlap=overlap) as engine:  # fmt: skip
            results: list[aserve.CompletionResult] = []
            deltas: list[list[aserve.Delta]] = []
            neighbour: list[aserve.CompletionResult] = []

            async def generating() -> None:
                neighbour.append(await engine.complete(prompts[1], aserve.SamplingParams(max_tokens=6, temperature=0,
                                                                                          ignore_eos=True)))  # fmt: skip

            async def streamed(prompt: list[int]) -> None:
                deltas.append([d async for d in engine.generate(prompt, zero)])

            async with anyio.create_task_group() as tg:
                tg.start_soon(generating)
                results.append(await engine.complete_many(prompts, zero))
                tg.start_soon(streamed, prompts[0])
            # No prompt logprobs: the prefix cache holds this prompt now, and its last token
            # is still computed, then nothing is sampled.
            results.append(await engine.complete(prompts[0], aserve.SamplingParams(max_tokens=0)))
            ledger = engine.ledger()
            assert ledger.balanced and ledger.all_free, ledger
            return results, deltas, neighbour[0]

    (many, cached), (stream,), neighbour = anyio.run(run)
    from tests.tiny import hf_greedy

    assert neighbour.token_ids == list(hf_greedy(hf, prompts[1], 6)[0])
    assert many.usage.completion_tokens == 0 and many.usage.prompt_tokens == sum(len(p) for p in prompts)
    assert [o.finish_reason for o in many.outputs] == ["length"] * 3
    assert all(o.token_ids == [] and o.text == "" for o in many.outputs)
    assert cached.outputs[0].finish_reason == "length" and cached.outputs[0].token_ids == []
    assert cached.outputs[0].prompt_logprobs is None and cached.usage.cached_tokens > 0
    assert [(d.token_ids, d.finish_reason) for d in stream] == [([], "length")]
    assert stream[0].prompt_logprobs == many.outputs[0].prompt_logprobs
    for prompt, out in zip(prompts, many.outputs, strict=True):
        got = out.prompt_logprobs
        assert got is not None and len(got) == len(prompt) and got[0] is None
        for j, (lp, (ref_lp, ref_top)) in enumerate(zip(got[1:], _reference(hf, prompt, k), strict=True), start=1):
            assert lp is not None and lp.token_id == prompt[j]
            assert abs(lp.logprob - ref_lp) < 1e-3, (j, lp.logprob, ref_lp)
            assert [t for t, _ in lp.top] == ref_top, j

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

"""The packaged default model (Gemma 3 270M, GGUF) through the whole engine.

Greedy output must match transformers (its GGUF loader, float32) token for token; on a CPU
the engine's default runs the GGUF's own blocks on aserve's kernel (same weights), here with
the float32 LM head and prefill. The
reference file is written by ``scripts/make_reference.py``, which runs transformers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import aserve
from tests.hosting import hosted_engine

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gemma3_270m_greedy.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[aserve.Engine]:
    # Float32 throughout: token for token against transformers. The defaults' 8-bit head and
    # bfloat16 prefill matmuls (on CPUs with AVX-512 VNNI / BF16) are held to issue 20's
    # quality bar instead (aserve.bench.quality: top-1 agreement and perplexity over 20k positions).
    async with hosted_engine(model="gemma-3-270m", debug=True, gguf_head="float32", gguf_prefill="float32") as eng:
        yield eng


async def test_greedy_matches_transformers_batched(engine: aserve.Engine) -> None:
    params = aserve.SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    results: dict[int, aserve.CompletionResult] = {}

    async def one(i: int) -> None:
        results[i] = await engine.complete(CASES[i]["prompt"], params)

    async with anyio.create_task_group() as tg:
        for i in range(len(CASES)):
            tg.start_soon(one, i)
    assert len(CASES) >= 8
    for i, case in enumerate(CASES):
        assert results[i].prompt_token_ids == case["prompt_ids"], case["prompt"]
        assert results[i].token_ids == case["output_ids"], case["prompt"]
    ledger = engine.ledger()
    assert ledger.balanced and ledger.all_free


async def test_stream_equals_final_and_tokenizer(engine: aserve.Engine) -> None:
    case = CASES[0]
    params = aserve.SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    deltas = [d async for d in engine.generate(case["prompt"], params)]
    assert [t for d in deltas for t in d.token_ids] == case["output_ids"]
    text = "".join(d.text for d in deltas)
    assert text == engine.tokenizer.decode(case["output_ids"])
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    # encode() adds no special tokens unless asked.
    assert engine.tokenizer.encode(case["prompt"]) == case["prompt_ids"][1:]
    assert engine.tokenizer.encode(case["prompt"], add_special_tokens=True) == case["prompt_ids"]


async def test_stats_and_info(engine: aserve.Engine) -> None:
    st = engine.stats()
    assert st.kv_total_tokens > 0 and st.kv_ledger_balanced
    assert st.pipeline_depth == 2
    assert st.num_steps > 0 and st.device_busy_s > 0
    info = engine.info()
    assert info["architecture"] == "gemma3" and info["dtype"] == "float32" and info["device"] == "cpu"
    from aserve.kernels.gguf_linear import kernel

    # The CPU default runs the GGUF's own blocks where the kernel was built (activations float32).
    assert info["weights"].startswith("gguf blocks") == (kernel() is not None), info["weights"]

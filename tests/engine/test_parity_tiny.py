"""Engine output vs transformers on tiny random Gemma 3 and Llama checkpoints (float32, CPU).

Greedy tokens must match exactly and per-token logprobs within 1e-3, for a request alone
and for many requests of mixed lengths batched together, with and without chunked prefill,
serial and overlapped.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest

import aserve
from tests.tiny import hf_greedy
from tests.workload import complete_all

MAX_NEW = 20


def _prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, vocab) for _ in range(rng.choice([1, 4, 11, 30, 57]))] for _ in range(n)]


def _check(kind_fixture: tuple[Path, Any], prompts: list[list[int]], **engine_kwargs: Any) -> Any:
    path, hf = kind_fixture
    refs = [hf_greedy(hf, p, MAX_NEW) for p in prompts]
    params = aserve.SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True, logprobs=0)

    async def run() -> list[aserve.CompletionResult]:
        async with aserve.Engine(model=str(path), debug=True, warmup=False, **engine_kwargs) as engine:
            out: list[aserve.CompletionResult | None] = [None] * len(prompts)

            async def one(i: int) -> None:
                out[i] = await engine.complete(prompts[i], params)

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            ledger = engine.ledger()
            assert ledger.balanced and ledger.all_free, ledger
            graphs = engine.runner.decode_graphs
            runs.append(0 if graphs is None else graphs.runs)
            return [r for r in out if r is not None]

    runs: list[int] = []
    results = anyio.run(run)
    for prompt, (ref_ids, ref_lps), res in zip(prompts, refs, results):
        assert res.token_ids == ref_ids, f"prompt {prompt}: {res.token_ids} != {ref_ids}"
        assert res.logprobs is not None
        got = [lp.logprob for lp in res.logprobs]
        assert max(abs(a - b) for a, b in zip(got, ref_lps)) < 1e-3
    return runs[0]


@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
@pytest.mark.parametrize("overlap", [False, True])
def test_alone(model: str, overlap: bool, request: pytest.FixtureRequest) -> None:
    fx = request.getfixturevalue(model)
    _check(fx, _prompts(384, 1, seed=1), overlap=overlap)


@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("chunk", [2048, 16])
def test_batched_mixed_lengths(model: str, overlap: bool, chunk: int, request: pytest.FixtureRequest) -> None:
    fx = request.getfixturevalue(model)
    _check(fx, _prompts(384, 10, seed=2), overlap=overlap, max_num_batched_tokens=chunk)


@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
def test_triton_attention_backend(model: str, request: pytest.FixtureRequest) -> None:
    """The Triton kernels (interpreted on a CPU) in the whole engine — paged attention and
    the fused norms, rotary and gated activations: chunked prefills, mixed batches and
    decodes still match transformers."""
    pytest.importorskip("triton")
    fx = request.getfixturevalue(model)
    _check(
        fx,
        _prompts(384, 4, seed=3),
        overlap=True,
        max_num_batched_tokens=16,
        attention_backend="triton",
        fused_ops=True,
    )


@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
def test_decode_graph_static_path(model: str, request: pytest.FixtureRequest) -> None:
    """The CUDA-graph decode path's static, padded buffers (run uncaptured on a CPU): batch
    sizes between ladder rungs, padded rows, mixed with eager prefills; same tokens."""
    pytest.importorskip("triton")
    fx = request.getfixturevalue(model)
    runs = _check(
        fx, _prompts(384, 5, seed=4), overlap=True, max_num_batched_tokens=16, attention_backend="triton",
        cuda_graph=True, max_running_requests=6, max_context=128,
    )  # fmt: skip
    assert runs > 0, "no decode step went through the static path"


def test_decode_graph_in_graph_greedy_and_eager_sampler(tiny_llama: tuple[Path, Any]) -> None:
    """The graph path's two exits: pure greedy (argmax and FutureMap publish inside the graph)
    must match transformers; seeded sampling (the sampler after the graph, publishing over the
    greedy tokens) must match the eager path token for token. Debug mode checks the FutureMap."""
    pytest.importorskip("triton")
    path, hf = tiny_llama
    prompts = _prompts(384, 5, seed=6)
    refs = [hf_greedy(hf, p, 12)[0] for p in prompts]

    async def run(cuda_graph: bool, sampled: bool) -> tuple[list[list[int]], int, int]:
        async with aserve.Engine(model=str(path), debug=True, warmup=False, attention_backend="triton",
                                 cuda_graph=cuda_graph, max_running_requests=6, max_context=128) as engine:  # fmt: skip

            def params(i: int) -> aserve.SamplingParams:
                # Sampled runs: odd rows carry a logit bias too (a sparse add before the sampler).
                bias = {5: 2.0, 7: -1.5} if sampled and i % 2 else {}
                return aserve.SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.9 if sampled else 0.0,
                                             seed=100 + i, logit_bias=bias)  # fmt: skip

            out = await complete_all(engine, prompts, params)
            assert engine.ledger().all_free
            graphs = engine.runner.decode_graphs
            runs = 0 if graphs is None else graphs.runs
            return out, runs, engine.runner.fast_graph_steps

    greedy, runs, fast = anyio.run(run, True, False)
    assert runs > 0 and greedy == refs
    assert fast > 0, "greedy graph steps should skip the sampling inputs (host fast path)"
    sampled_graph, runs, fast = anyio.run(run, True, True)
    sampled_eager, _, _ = anyio.run(run, False, True)
    assert runs > 0 and sampled_graph == sampled_eager
    assert fast == 0, "sampled rows need the sampler's inputs"
    assert sampled_graph != greedy  # the sampler really ran

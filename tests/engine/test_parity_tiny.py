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


def _check(kind_fixture: tuple[Path, Any], prompts: list[list[int]], **engine_kwargs: Any) -> tuple[int, int]:
    """Returns how many steps ran from the decode graphs' and the prefill graphs' buffers."""
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
            graphs, xgraphs = engine.runner.decode_graphs, engine.runner.extend_graphs
            runs.append((0 if graphs is None else graphs.runs, 0 if xgraphs is None else xgraphs.runs))
            return [r for r in out if r is not None]

    runs: list[tuple[int, int]] = []
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
    runs, _ = _check(
        fx, _prompts(384, 5, seed=4), overlap=True, max_num_batched_tokens=16, attention_backend="triton",
        cuda_graph=True, max_running_requests=6, max_context=128, cuda_graph_max_tokens=0,
    )  # fmt: skip
    assert runs > 0, "no decode step went through the static path"


@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
def test_prefill_graph_static_path(model: str, request: pytest.FixtureRequest) -> None:
    """The prefill/mixed-step graphs' padded buffers (run uncaptured on a CPU): chunks and
    mixed batches padded to the token ladder (16, 32, 48 here), padding sequences, the decodes'
    tokens gathered into the graph's input; greedy tokens and logprobs match transformers."""
    pytest.importorskip("triton")
    fx = request.getfixturevalue(model)
    decode_runs, prefill_runs = _check(
        fx, _prompts(384, 7, seed=5), overlap=True, max_num_batched_tokens=48, attention_backend="triton",
        cuda_graph=True, max_running_requests=5, max_context=128,
    )  # fmt: skip
    assert prefill_runs > 0 and decode_runs > 0


def test_prompt_logprobs_steps_stay_eager_beside_prefill_graphs(tiny_gemma: tuple[Path, Any]) -> None:
    """A step with prompt-logprob rows needs logits at every prompt position: it runs eagerly
    while the other steps replay; its results equal those of an engine without graphs."""
    pytest.importorskip("triton")
    path, _ = tiny_gemma
    rng = random.Random(7)
    prompts = [[1] + [rng.randrange(3, 384) for _ in range(n)] for n in (40, 30, 20, 25)]  # 32-token steps
    plp = aserve.SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, prompt_logprobs=2)
    plain = aserve.SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    async def run(cuda_graph: bool) -> tuple[list[Any], int]:
        async with aserve.Engine(model=str(path), debug=True, warmup=False, attention_backend="triton",
                                 cuda_graph=cuda_graph, max_running_requests=4, max_context=128,
                                 max_num_batched_tokens=32) as engine:  # fmt: skip
            results: list[Any] = [None] * len(prompts)

            async def one(i: int) -> None:
                r = await engine.complete(prompts[i], plp if i == 3 else plain)  # queued last
                results[i] = (r.token_ids, r.outputs[0].prompt_logprobs)

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            assert engine.ledger().all_free
            xgraphs = engine.runner.extend_graphs
            return results, 0 if xgraphs is None else xgraphs.runs

    graph, runs = anyio.run(run, True)
    eager, _ = anyio.run(run, False)
    assert runs > 0
    assert [ids for ids, _ in graph] == [ids for ids, _ in eager]
    for (_, a), (_, b) in zip(graph, eager, strict=True):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert [x.logprob for x in a[1:]] == pytest.approx([x.logprob for x in b[1:]], abs=1e-4)


def test_decode_graph_in_graph_greedy_and_eager_sampler(tiny_llama: tuple[Path, Any]) -> None:
    """The graph paths' two exits: pure greedy (argmax and FutureMap publish inside the decode
    graph, argmax and publish after the prefill graph) must match transformers; seeded sampling (the sampler after the graph, publishing over the
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
            graphs, xgraphs = engine.runner.decode_graphs, engine.runner.extend_graphs
            # Both kinds of graph served steps: prefills (the sampler, or the argmax, after the
            # prefill graph) and decodes.
            runs = 0 if graphs is None or xgraphs is None else min(graphs.runs, xgraphs.runs)
            all_runs = 0 if graphs is None or xgraphs is None else graphs.runs + xgraphs.runs
            return out, runs, engine.runner.fast_graph_steps - all_runs * (not sampled)

    greedy, runs, fast_minus_graph_steps = anyio.run(run, True, False)
    assert runs > 0 and greedy == refs
    # Every step was a graph's, and every one skipped the sampling inputs (host fast path).
    assert fast_minus_graph_steps == 0
    sampled_graph, runs, fast = anyio.run(run, True, True)
    sampled_eager, _, _ = anyio.run(run, False, True)
    assert runs > 0 and sampled_graph == sampled_eager
    assert fast == 0, "sampled rows need the sampler's inputs"
    assert sampled_graph != greedy  # the sampler really ran

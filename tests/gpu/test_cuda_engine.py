"""GPU-only checks (run on the H200 with ``pytest -m gpu tests/gpu``): the CUDA paths that a
CPU cannot exercise — captured decode graphs, compiled Triton kernels, and a host path that
never synchronises with the device while requests run."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import aserve
from tests.tiny import hf_greedy
from tests.workload import complete_all

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


EAGER = {"attention_backend": "torch", "fused_ops": False, "cuda_graph": False}


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 384) for _ in range(rng.choice([3, 17, 40]))] for _ in range(n)]


@pytest.mark.parametrize(
    "opts",
    [
        EAGER,
        {"attention_backend": "triton", "fused_ops": False, "cuda_graph": False},
        {"attention_backend": "triton", "fused_ops": True, "cuda_graph": False},
        {},  # the CUDA defaults: Triton attention, fused ops, CUDA graphs
    ],
    ids=["torch-eager", "triton", "triton-fused", "defaults"],
)
@pytest.mark.parametrize("model", ["tiny_gemma", "tiny_llama"])
def test_float32_greedy_matches_transformers_on_cuda(
    model: str, opts: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    path, hf = request.getfixturevalue(model)
    prompts = _prompts(6, seed=1)
    refs = [hf_greedy(hf, p, 16)[0] for p in prompts]
    params = aserve.SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)

    async def run() -> list[list[int]]:
        async with aserve.Engine(model=str(path), device="cuda", dtype="float32", max_running_requests=8,
                                 max_context=128, kv_cache_bytes=2**26, **opts) as engine:  # fmt: skip
            out = await complete_all(engine, prompts, params)
            if engine.config.use_cuda_graph:
                assert engine.runner.decode_graphs is not None and engine.runner.decode_graphs.runs > 0
                assert engine.runner.extend_graphs is not None and engine.runner.extend_graphs.runs > 0
            return out

    with _NoTF32():
        assert anyio.run(run) == refs


class _NoTF32:
    def __enter__(self) -> None:
        self.prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc: object) -> None:
        torch.backends.cuda.matmul.allow_tf32 = self.prev


# Every sampler feature, so each one's device path is checked for hidden synchronisation.
SAMPLING_VARIANTS = [
    aserve.SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9),
    aserve.SamplingParams(max_tokens=12, temperature=0),
    aserve.SamplingParams(max_tokens=12, temperature=1.0, top_k=20, min_p=0.05, seed=3),
    aserve.SamplingParams(
        max_tokens=12, temperature=0.8, repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3
    ),
    aserve.SamplingParams(max_tokens=12, temperature=0, logprobs=3),
    aserve.SamplingParams(max_tokens=12, temperature=0, logit_bias={5: 3.0, 9: -2.0}),
    aserve.SamplingParams(max_tokens=12, temperature=0.7, min_tokens=8),
]


@pytest.mark.parametrize("opts", [EAGER, {}], ids=["torch-eager", "defaults"])
def test_no_host_device_sync_while_serving(tiny_llama: tuple[Path, Any], opts: dict[str, Any]) -> None:
    """Plan, launch and commit never wait on the device: CUDA's sync debug mode raises on
    any synchronising call made while requests run (start-up and shutdown are outside)."""
    path, _ = tiny_llama

    async def run() -> None:
        async with aserve.Engine(
            model=str(path), device="cuda", max_running_requests=16, max_context=256, **opts
        ) as engine:
            torch.cuda.set_sync_debug_mode("error")
            try:
                async with anyio.create_task_group() as tg:
                    for i, p in enumerate(_prompts(12, seed=2)):
                        tg.start_soon(engine.complete, p, SAMPLING_VARIANTS[i % len(SAMPLING_VARIANTS)])
            finally:
                torch.cuda.set_sync_debug_mode("default")

    anyio.run(run)


def test_defaults_are_the_fast_path_and_overlap_matches_serial(tiny_gemma: tuple[Path, Any]) -> None:
    """The CUDA defaults (graphs, Triton, fused ops): seeded sampling gives the same tokens with
    overlap on and off, across batch sizes that pad to different graphs. float32: bf16 GEMMs
    are not batch-invariant, and the two modes may group arrivals into steps differently."""
    path, _ = tiny_gemma
    prompts = _prompts(13, seed=5)

    async def run(overlap: bool, depth: int | None = None) -> list[list[int]]:
        async with aserve.Engine(model=str(path), device="cuda", dtype="float32", overlap=overlap, overlap_depth=depth,
                                 max_running_requests=16, max_context=256) as engine:  # fmt: skip
            cfg = engine.config
            assert cfg.resolved_attention_backend == "triton" and cfg.use_fused_ops and cfg.use_cuda_graph
            assert engine.stats().pipeline_depth == (1 if not overlap else depth or 3)  # 3 by default on CUDA
            out = await complete_all(
                engine,
                prompts,
                lambda i: aserve.SamplingParams(
                    max_tokens=10 + 3 * i, temperature=0.8, top_k=40, seed=i, ignore_eos=True
                ),
            )
            assert engine.runner.decode_graphs is not None and engine.runner.decode_graphs.runs > 0
            return out

    serial = anyio.run(run, False)
    assert anyio.run(run, True) == serial  # the default on CUDA: depth 3, two steps queued ahead
    assert anyio.run(run, True, 2) == serial  # SGLang's depth: one step ahead


@pytest.mark.parametrize("wait", ["poll", "spin", "thread"])
def test_every_cuda_event_wait_gives_the_serial_tokens(tiny_gemma: tuple[Path, Any], wait: str) -> None:
    """However the loop awaits a step's CUDA events (a 50 us poll, a poll at every pass of the
    loop, a helper thread), overlap gives serial's greedy tokens."""
    path, _ = tiny_gemma
    prompts = _prompts(9, seed=7)

    async def run(overlap: bool, how: str) -> list[list[int]]:
        async with aserve.Engine(model=str(path), device="cuda", dtype="float32", overlap=overlap,
                                 cuda_event_wait=how, max_running_requests=16, max_context=256) as engine:  # fmt: skip
            assert engine.runner.event_poll_s == (0.0 if how == "spin" else 50e-6)
            params = lambda i: aserve.SamplingParams(max_tokens=12 + i, temperature=0, ignore_eos=True)  # noqa: E731
            return await complete_all(engine, prompts, params)

    assert anyio.run(run, True, wait) == anyio.run(run, False, "poll")


def test_logprobs_do_not_change_the_sampled_tokens_on_cuda(tiny_gemma: tuple[Path, Any]) -> None:
    """Seeded sampled requests give the same tokens with and without top logprobs. The D2H staging once gave the sampled ids and
    the top ids (both int64) one buffer, so the top ids' copy overwrote the tokens."""
    path, _ = tiny_gemma
    prompts = _prompts(6, seed=7)

    async def run(logprobs: int | None) -> list[aserve.CompletionResult]:
        async with aserve.Engine(model=str(path), device="cuda", dtype="float32", max_context=256) as engine:
            params = [aserve.SamplingParams(max_tokens=12, temperature=0.9, seed=i, ignore_eos=True,
                                            logprobs=logprobs) for i in range(len(prompts))]  # fmt: skip
            return [await engine.complete(p, sp) for p, sp in zip(prompts, params, strict=True)]

    plain = anyio.run(run, None)
    with_top = anyio.run(run, 3)
    for a, b in zip(plain, with_top, strict=True):
        assert a.token_ids == b.token_ids
        assert b.logprobs is not None and len(b.logprobs) == len(b.token_ids)

"""The fault suite's CUDA twin (``tests/engine/test_faults.py`` on a CPU): on CUDA the forward
is enqueued on the loop's thread inside launch, decode steps replay captured graphs, and a
stalled kernel stalls the events the engine awaits. Run with ``pytest -m gpu tests/gpu``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import aserve
from tests.workload import complete_all, complete_each

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

EAGER = {"attention_backend": "torch", "fused_ops": False, "cuda_graph": False}
PROMPTS = [[1, *range(5 + i, 5 + i + 2 + i)] for i in range(5)]
PARAMS = aserve.SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
LONG = aserve.SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)  # still running at the fault
TRIGGER = 333  # a prompt holding it three times meets the fault in its prefill
BOUND_S = 60


def _engine(path: Path, opts: dict[str, Any], **kw: Any) -> aserve.Engine:
    return aserve.Engine(model=str(path), device="cuda", dtype="float32", max_running_requests=8, max_context=128,
                         kv_cache_bytes=2**26, warmup=False, **opts, **kw)  # fmt: skip


def _triggered(input_ids: torch.Tensor) -> bool:
    return int((input_ids == TRIGGER).sum()) >= 3  # a sync, fine in a test


async def _each(engine: aserve.Engine, prompts: list[list[int]], params: aserve.SamplingParams = PARAMS) -> list[Any]:
    return await complete_each(engine, prompts, params)


def _assert_nothing_left(engine: aserve.Engine) -> None:
    ledger = engine.ledger()
    assert ledger.balanced and ledger.all_free, ledger
    assert not engine.scheduler.running and not engine.scheduler.waiting and not engine._loop.live
    assert not engine._loop._uncommitted and engine.future_map.tokens.numel() == 0


@pytest.mark.parametrize("opts", [EAGER, {}], ids=["torch-eager", "defaults"])
def test_an_exception_in_the_cuda_forward_fails_every_request_and_a_new_engine_serves(
    tiny_llama: tuple[Path, Any], opts: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raised in launch, on the loop's thread (the forward is enqueued there): every request in
    flight, decoding from graphs or not, ends with EngineFailedError; the engine closes with
    the ledger at zero and gives its memory back, and a fresh engine in the process serves."""
    path, _ = tiny_llama

    async def run() -> tuple[list[Any], aserve.Engine, list[list[int]]]:
        engine = _engine(path, opts)
        async with engine:
            model = engine.runner.model
            real = model.forward

            def faulty(input_ids: torch.Tensor, *args: Any) -> Any:
                if _triggered(input_ids):
                    raise RuntimeError("injected fault in the CUDA forward")
                return real(input_ids, *args)

            monkeypatch.setattr(model, "forward", faulty)
            xgraphs = engine.runner.extend_graphs
            if xgraphs is not None:  # prefills replay from graphs: the fault meets their inputs
                real_run = xgraphs.run

                def faulty_run(graph_inputs: torch.Tensor, *args: Any) -> Any:
                    assert xgraphs is not None
                    if _triggered(graph_inputs[: xgraphs._static[graph_inputs.shape[0]].tokens]):
                        raise RuntimeError("injected fault in the CUDA forward")
                    return real_run(graph_inputs, *args)

                monkeypatch.setattr(xgraphs, "run", faulty_run)
            with anyio.fail_after(BOUND_S):
                results: list[Any] = []

                async def others() -> None:
                    results.extend(await _each(engine, PROMPTS, LONG))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(others)
                    while engine.committer.output_tokens < 10:  # the others decode by now
                        await anyio.sleep(0.001)
                    results.extend(await _each(engine, [[1, TRIGGER, TRIGGER, TRIGGER]]))
        async with _engine(path, opts) as fresh:
            again = await complete_all(fresh, PROMPTS[:2], PARAMS)
        return results, engine, again

    results, engine, again = anyio.run(run)
    assert len(results) == len(PROMPTS) + 1
    assert all(isinstance(e, aserve.EngineFailedError) and "injected fault" in str(e) for e in results), results
    _assert_nothing_left(engine)
    assert all(len(ids) == PARAMS.max_tokens for ids in again)


# A stalled kernel blocks the loop's own thread in the next CUDA call (H200, 2026-12-04), so the
# coroutine watchdog cannot run there: the backstop thread ends the process, which is tested in
# a child process (tests/engine/test_watchdog_backstop.py, its cuda case).


def test_a_raising_allocator_on_cuda_ends_one_request_and_the_graphs_keep_the_others_tokens(
    tiny_llama: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA defaults (decode graphs, padded batches): a decode page allocation that raises
    ends one request with KVAllocationError; the others' greedy tokens equal a clean run."""
    path, _ = tiny_llama

    async def run(fault: bool) -> list[Any]:
        async with _engine(path, {}) as engine:
            pages = engine.scheduler.pool.pages
            real = pages.alloc
            calls = {"n": 0}

            def alloc(n: int) -> Any:
                calls["n"] += 1
                if fault and calls["n"] == len(PROMPTS) + 3:
                    raise MemoryError("injected allocator failure")
                return real(n)

            monkeypatch.setattr(pages, "alloc", alloc)
            with anyio.fail_after(BOUND_S):
                out = await _each(engine, PROMPTS)
                while not engine.ledger().all_free:
                    await anyio.sleep(0.01)
            assert engine.runner.decode_graphs is not None and engine.runner.decode_graphs.runs > 0
            return out

    clean = [r.token_ids for r in anyio.run(run, False)]
    faulty = anyio.run(run, True)
    failed = [i for i, r in enumerate(faulty) if isinstance(r, Exception)]
    assert len(failed) == 1 and isinstance(faulty[failed[0]], aserve.KVAllocationError), faulty
    assert [r.token_ids for i, r in enumerate(faulty) if i not in failed] == [
        c for i, c in enumerate(clean) if i not in failed
    ]

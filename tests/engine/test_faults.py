"""Fault injection (issue 18): what a request sees when the engine meets a fault, and what is
left afterwards. Each fault is injected where it would really happen:

* an exception inside the model's forward (on a CPU it runs on the stream's worker thread), in
  the host's launch of a step (where a CUDA forward raises: kernels are enqueued on the loop's
  thread) and in the commit: fatal. Every request in flight ends with ``EngineFailedError``
  (no hang, no bare RuntimeError, no cancellation leaking into the caller's tasks), new
  requests are refused with it, and the engine closes cleanly with the KV ledger back to zero;
* a KV allocation that raises, or says "no room" where room was counted: only the request
  being planned is affected (it ends with ``KVAllocationError``, or sits a step out and
  finishes normally); the others' tokens equal a run without the fault;
* a step whose device work never completes: the watchdog (``watchdog_timeout``) ends every
  request with an error naming the stall, and the engine closes without waiting on the device;
* a consumer that never reads its stream: the others run on, the unread request ends at
  ``max_tokens`` holding only its tokens, and its KV returns before anyone reads it.

A GPU twin is ``tests/gpu/test_cuda_faults.py``; the server's side is
``tests/server/test_engine_faults.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import aserve
from tests.workload import complete_each as each

# Distinct prompt lengths, so requests cross KV page boundaries (page_size 4) at different steps.
PROMPTS = [[1, *range(5 + i, 5 + i + 2 + i)] for i in range(5)]
PARAMS = aserve.SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
BOUND_S = 60  # generous: the CI machine is a loaded 2-core VM; what matters is "ends", not how fast


def config(path: Path, **kw: Any) -> aserve.EngineConfig:
    return aserve.EngineConfig(**{"model": str(path), "debug": True, "warmup": False, "page_size": 4, **kw})


@pytest.fixture(scope="module")
def clean_tokens(tiny_llama: tuple[Path, Any]) -> list[list[int]]:
    """The prompts' greedy tokens without any fault: the reference the faulty runs must match."""

    async def run() -> list[list[int]]:
        async with aserve.Engine(config(tiny_llama[0])) as engine:
            return [(await engine.complete(p, PARAMS)).token_ids for p in PROMPTS]

    return anyio.run(run)


async def complete_each(engine: aserve.Engine, prompts: list[list[int]]) -> list[Any]:
    return await each(engine, prompts, PARAMS)


async def stream_each(engine: aserve.Engine, prompt: list[int]) -> Any:
    """A streamed request read to the end: its token ids, or the exception it raised."""
    ids: list[int] = []
    try:
        async for d in engine.generate(prompt, PARAMS):
            ids += d.token_ids
    except Exception as exc:
        return exc
    return ids


async def wait_ledger_free(engine: aserve.Engine) -> None:
    with anyio.fail_after(BOUND_S):
        while not engine.ledger().all_free:
            await anyio.sleep(0.01)


def assert_nothing_left(engine: aserve.Engine) -> None:
    """After close: every KV page and row free, no request queued, running or pending a step."""
    ledger = engine.ledger()
    assert ledger.balanced and ledger.all_free and ledger.used_pages == 0, ledger
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert not engine.scheduler.stuck and not engine.scheduler.failed
    assert not engine._loop.live and not engine._loop._uncommitted
    assert engine.future_map.tokens.numel() == 0  # released with the device's memory
    assert not engine.runner.staging._bufs and not engine.runner.out_staging._bufs


# -- 1. an exception inside a step: fatal -----------------------------------------------------


def _raise_on_call(n: int, real: Callable[..., Any], what: str) -> Callable[..., Any]:
    calls = {"n": 0}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError(f"injected fault in {what}")
        return real(*args, **kwargs)

    return flaky


def _inject(engine: aserve.Engine, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if where == "forward":  # the model itself: on a CPU, on the stream's worker thread
        model = engine.runner.model
        monkeypatch.setattr(model, "forward", _raise_on_call(6, model.forward, "forward"))
    elif where == "launch":  # the host's launch, where a CUDA forward raises
        monkeypatch.setattr(engine.runner, "launch", _raise_on_call(6, engine.runner.launch, "launch"))
    else:
        monkeypatch.setattr(engine.committer, "commit", _raise_on_call(6, engine.committer.commit, "commit"))


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
@pytest.mark.parametrize("where", ["forward", "launch", "commit"])
def test_an_exception_in_a_step_fails_every_request_and_the_engine_closes_clean(
    tiny_llama: tuple[Path, Any], where: str, overlap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def run() -> tuple[list[Any], Any, BaseException | None, aserve.Engine]:
        engine = aserve.Engine(config(tiny_llama[0], overlap=overlap))
        async with engine:
            _inject(engine, where, monkeypatch)
            with anyio.fail_after(BOUND_S):
                results: list[Any] = [None, None]

                async def completes() -> None:
                    results[0] = await complete_each(engine, PROMPTS[:4])

                async def streams() -> None:
                    results[1] = await stream_each(engine, PROMPTS[4])

                async with anyio.create_task_group() as tg:
                    tg.start_soon(completes)
                    tg.start_soon(streams)
            refused = None
            try:
                await engine.complete([1, 2, 3], PARAMS)
            except aserve.AserveError as exc:
                refused = exc
        return [*results[0], results[1]], refused, engine.failure, engine

    outcomes, refused, failure, engine = anyio.run(run)
    assert isinstance(failure, aserve.EngineFailedError) and "injected fault" in str(failure)
    for out in outcomes:  # the same typed error for everyone in flight
        assert isinstance(out, aserve.EngineFailedError), out
        assert "the engine failed" in str(out)
    assert isinstance(refused, aserve.EngineFailedError) and "no new requests" in str(refused)
    assert engine.requests_aborted == len(PROMPTS)
    assert_nothing_left(engine)


# -- 2. a failed KV allocation: only the request being planned -------------------------------


@pytest.mark.parametrize("at", ["admission", "decode"])
def test_an_allocator_that_raises_ends_only_the_request_it_was_planning(
    tiny_llama: tuple[Path, Any], clean_tokens: list[list[int]], at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def run() -> tuple[list[Any], aserve.Engine, Any]:
        engine = aserve.Engine(config(tiny_llama[0]))
        async with engine:
            pool = engine.scheduler.pool
            if at == "admission":  # prefill chunks grow a request's pages through grow()
                monkeypatch.setattr(pool, "grow", _raise_on_call(3, pool.grow, "grow"))
            else:  # a decode crossing a page boundary takes one page straight from the allocator

                def decode_alloc(n: int) -> Any:
                    # The 3rd single-page allocation after admission: a decode's.
                    decode_alloc.calls += 1  # type: ignore[attr-defined]
                    if decode_alloc.calls == 3 + len(PROMPTS):  # type: ignore[attr-defined]
                        raise MemoryError("injected allocator failure")
                    return real_alloc(n)

                real_alloc = pool.pages.alloc
                decode_alloc.calls = 0  # type: ignore[attr-defined]
                monkeypatch.setattr(pool.pages, "alloc", decode_alloc)
            with anyio.fail_after(BOUND_S):
                out = await complete_each(engine, PROMPTS)
                await wait_ledger_free(engine)
            after = await engine.complete(PROMPTS[0], PARAMS)  # the engine serves on
        return out, engine, after

    out, engine, after = anyio.run(run)
    failed = [i for i, o in enumerate(out) if isinstance(o, Exception)]
    assert len(failed) == 1, out
    err = out[failed[0]]
    assert isinstance(err, aserve.KVAllocationError) and "KV memory could not be allocated" in str(err), err
    for i, o in enumerate(out):
        if i not in failed:
            assert o.token_ids == clean_tokens[i] and o.finish_reason == "length", i
    assert after.token_ids == clean_tokens[0] and engine.failure is None
    assert_nothing_left(engine)


@pytest.mark.parametrize("at", ["admission", "decode"])
def test_an_allocator_that_says_no_room_where_room_was_counted_delays_but_changes_nothing(
    tiny_llama: tuple[Path, Any], clean_tokens: list[list[int]], at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler counts free pages before it allocates; an allocator that refuses anyway
    (a bookkeeping fault) used to trip an assert that killed the step loop. Now the request
    being planned waits for a later step, and every request's tokens are unchanged."""

    async def run() -> tuple[list[Any], aserve.Engine, int]:
        engine = aserve.Engine(config(tiny_llama[0]))
        async with engine:
            pages = engine.scheduler.pool.pages
            real = pages.alloc
            calls = {"n": 0, "refused": 0}
            first = 2 if at == "admission" else len(PROMPTS) + 2

            def refusing(n: int) -> list[int] | None:
                calls["n"] += 1
                if first <= calls["n"] < first + 3:  # three refusals in a row
                    calls["refused"] += 1
                    return None
                return real(n)

            monkeypatch.setattr(pages, "alloc", refusing)
            with anyio.fail_after(BOUND_S):
                out = await complete_each(engine, PROMPTS)
                await wait_ledger_free(engine)
        return out, engine, calls["refused"]

    out, engine, refused = anyio.run(run)
    assert refused == 3
    assert [o.token_ids for o in out] == clean_tokens
    assert_nothing_left(engine)


@pytest.mark.parametrize("fault", ["no-room", "raises"])
def test_a_lone_decoder_whose_page_is_refused(
    tiny_llama: tuple[Path, Any], clean_tokens: list[list[int]], fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One request decoding alone (in the decode batch) reaches a page start and the allocator
    says no room once, or raises. No room: it sits a step out and its tokens are unchanged.
    Raises: it ends with KVAllocationError and the engine serves on. (An empty decode block
    was once launched as a step here, which ended the engine.)"""

    async def run() -> tuple[Any, Any, aserve.Engine]:
        engine = aserve.Engine(config(tiny_llama[0]))
        async with engine:
            pages = engine.scheduler.pool.pages
            real, calls = pages.alloc, {"n": 0}

            def faulty(n: int) -> list[int] | None:
                calls["n"] += 1
                if calls["n"] == 2:  # the prompt's pages are call 1; its first decode page call 2
                    if fault == "raises":
                        raise MemoryError("injected allocator failure")
                    return None
                return real(n)

            with anyio.fail_after(BOUND_S):
                with monkeypatch.context() as m:
                    m.setattr(pages, "alloc", faulty)
                    try:
                        out: Any = await engine.complete(PROMPTS[0], PARAMS)
                    except aserve.AserveError as exc:
                        out = exc
                after = await engine.complete(PROMPTS[0], PARAMS)
        return out, after, engine

    out, after, engine = anyio.run(run)
    if fault == "no-room":
        assert out.token_ids == clean_tokens[0], out
    else:
        assert isinstance(out, aserve.KVAllocationError), out
    assert after.token_ids == clean_tokens[0] and engine.failure is None
    assert_nothing_left(engine)


def test_a_lone_request_the_allocator_never_admits_ends_instead_of_hanging(
    tiny_llama: tuple[Path, Any], clean_tokens: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing runs, so nothing will ever commit and wake the planner again: a request the
    allocator keeps refusing used to wait forever. It ends with a typed error; the next runs."""

    async def run() -> tuple[BaseException | None, Any, aserve.Engine]:
        engine = aserve.Engine(config(tiny_llama[0]))
        err = None
        async with engine:
            pages = engine.scheduler.pool.pages
            with anyio.fail_after(BOUND_S):
                with monkeypatch.context() as m:
                    m.setattr(pages, "alloc", lambda n: None)
                    try:
                        await engine.complete(PROMPTS[0], PARAMS)
                    except aserve.AserveError as exc:
                        err = exc
                after = await engine.complete(PROMPTS[0], PARAMS)
        return err, after, engine

    err, after, engine = anyio.run(run)
    assert isinstance(err, aserve.KVAllocationError) and "no room" in str(err), err
    assert after.token_ids == clean_tokens[0]
    assert_nothing_left(engine)


# -- 3. a stalled device: the watchdog -------------------------------------------------------


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_a_step_that_never_completes_trips_the_watchdog(
    tiny_llama: tuple[Path, Any], overlap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 6th forward blocks the stream's worker thread (the CPU's device) until the test
    ends: that step's results never arrive. With ``watchdog_timeout=0.5`` every request ends
    with an error naming the stall, the engine closes without waiting for the device, and
    everything it held is returned."""
    never = threading.Event()

    async def run() -> tuple[list[Any], aserve.Engine]:
        engine = aserve.Engine(config(tiny_llama[0], overlap=overlap, watchdog_timeout=0.5))
        async with engine:
            model = engine.runner.model
            real = model.forward
            calls = {"n": 0}

            def stalls(*args: Any, **kwargs: Any) -> Any:
                calls["n"] += 1
                if calls["n"] == 6:
                    never.wait()
                return real(*args, **kwargs)

            monkeypatch.setattr(model, "forward", stalls)
            with anyio.fail_after(BOUND_S):
                out = await complete_each(engine, PROMPTS[:4])
                out.append(await stream_each(engine, PROMPTS[4]))
        return out, engine

    try:
        out, engine = anyio.run(run)
    finally:
        never.set()  # let the worker thread run out
    failure = engine.failure
    assert isinstance(failure, aserve.EngineFailedError) and engine._loop.stalled
    assert "watchdog_timeout" in str(failure) and "stalled" in str(failure)
    assert isinstance(out[-1], aserve.EngineFailedError)  # submitted after the stall: refused
    for o in out[:-1]:
        assert isinstance(o, aserve.EngineFailedError) and "stalled" in str(o), o
    assert_nothing_left(engine)


def test_a_stall_during_warm_up_fails_the_start_with_the_stall_error(
    tiny_llama: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine fails inside ``start`` (its warm-up requests): ``async with`` raises the
    stall error itself, with the half-started engine closed; it used to raise "Attempted to
    exit a cancel scope that isn't the current task's" and leave the step loop behind."""
    from aserve.models.causal_lm import CausalLM

    never = threading.Event()
    real = CausalLM.forward
    monkeypatch.setattr(CausalLM, "forward", lambda self, *args: never.wait() or real(self, *args))
    engine = aserve.Engine(config(tiny_llama[0], watchdog_timeout=0.5, warmup=True))

    async def run() -> None:
        with anyio.fail_after(BOUND_S):
            async with engine:
                pass

    try:
        with pytest.raises(aserve.EngineFailedError, match="stalled"):
            anyio.run(run)
    finally:
        never.set()
    assert engine._closed and engine.ledger().all_free


def test_watchdog_timeout_defaults_to_300_s_and_0_turns_it_off() -> None:
    assert aserve.EngineConfig().watchdog_s == 300.0
    assert aserve.EngineConfig(watchdog_timeout=0).watchdog_s is None
    assert aserve.EngineConfig(watchdog_timeout=None).watchdog_s is None
    with pytest.raises(aserve.InvalidRequestError, match="watchdog_timeout"):
        aserve.EngineConfig(watchdog_timeout=-1)


def test_a_waiting_queue_of_one_starts_warm_and_refuses_zero(tiny_llama: tuple[Path, Any]) -> None:
    """``max_waiting_requests=1``: the warm-up's two requests go one after the other (together,
    the second was refused and the engine failed to start); 0 would refuse every request."""
    with pytest.raises(aserve.InvalidRequestError, match="max_waiting_requests"):
        aserve.EngineConfig(max_waiting_requests=0)

    async def run() -> list[int]:
        async with aserve.Engine(model=str(tiny_llama[0]), warmup=True, max_waiting_requests=1) as engine:
            return (await engine.complete([1, 5, 9], aserve.SamplingParams(max_tokens=3, temperature=0))).token_ids

    assert len(anyio.run(run)) == 3


# -- 4. a consumer that never reads its stream ------------------------------------------------


def test_an_unread_stream_blocks_nobody_and_holds_only_its_tokens(
    tiny_llama: tuple[Path, Any], clean_tokens: list[list[int]]
) -> None:
    async def run() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with aserve.Engine(config(tiny_llama[0], stream_interval=1)) as engine:
            with anyio.fail_after(BOUND_S):
                unread = engine.open_stream(PROMPTS[0], PARAMS)  # never iterated until the end
                one_chunk = engine.open_stream(PROMPTS[1], PARAMS)  # reads one delta, then stalls
                first = await one_chunk.__anext__()
                readers = await complete_each(engine, PROMPTS[2:])
                seen["readers"] = [r.token_ids for r in readers]
                # The stalled readers' requests ran to max_tokens meanwhile, and gave their KV back.
                await wait_ledger_free(engine)
                for s in (unread, one_chunk):
                    req = s._reqs[0]
                    cell = req.cell
                    assert cell is not None
                    assert req.finish_reason == "length" and len(req.output_ids) == PARAMS.max_tokens
                    # What waits for the reader is its own tokens, nothing more.
                    assert len(cell.token_ids) <= PARAMS.max_tokens and req.resources_freed
                seen["stats"] = engine.stats()
                ids: list[int] = []
                async for d in unread:  # read late: everything is there, in order
                    ids += d.token_ids
                seen["unread"] = ids
                seen["one_chunk_first"] = first.token_ids
                await one_chunk.aclose()  # dropped unread: nothing to abort, nothing leaks
                # A long request whose reader never reads and then closes the stream: aborted.
                long = engine.open_stream(PROMPTS[0], aserve.SamplingParams(max_tokens=400, ignore_eos=True))
                while not long._reqs[0].output_ids:
                    await anyio.sleep(0.01)
                await long.aclose()
                await wait_ledger_free(engine)
                seen["long"] = long._reqs[0].finish_reason
            seen["counts"] = (engine.requests_finished, engine.requests_aborted)
            seen["live"] = len(engine._loop.live)
        return seen

    seen = anyio.run(run)
    assert seen["readers"] == clean_tokens[2:]
    assert seen["unread"] == clean_tokens[0]
    assert seen["one_chunk_first"] == clean_tokens[1][: len(seen["one_chunk_first"])]
    assert seen["long"] == "abort" and seen["counts"] == (len(PROMPTS), 1) and seen["live"] == 0

"""The four token states as awaitables on each step: planned → in-flight → materialized →
committed, each resolved once and in order, visible to any coroutine, cancelled at shutdown,
and drawn per step in the Perfetto trace.

``check_states`` is shared with the GPU test (``tests/gpu/test_token_states_cuda.py``)."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import aserve
from aserve.device.forward import StepForward
from aserve.device.step import Step

STATES = ("planned", "in_flight", "materialized", "committed")


async def check_states(engine: aserve.Engine, num_requests: int = 6, max_tokens: int = 8) -> list[dict[str, Any]]:
    """Serve a few requests while one waiter per state per step records what it saw when it
    woke; returns one row per step."""
    rows: list[dict[str, Any]] = []
    params = aserve.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    async def watch_state(step: Step, state: str, row: dict[str, Any]) -> None:
        await getattr(step, state).wait()
        # Every earlier state was resolved by the time this one woke its waiter.
        row[state] = [getattr(step, s).done() for s in STATES]
        if state == "committed":
            row["committed_outputs"] = [len(r.output_ids) for r in step.reqs()]

    def watch(step: Step) -> None:
        row: dict[str, Any] = {"step": step}
        rows.append(row)
        for state in STATES:
            watchers.start_soon(watch_state, step, state, row)

    async with engine.watch_steps() as steps, anyio.create_task_group() as watchers:
        async with anyio.create_task_group() as collector:

            async def collect() -> None:
                async for step in steps:
                    watch(step)

            collector.start_soon(collect)
            async with anyio.create_task_group() as tg:
                for i in range(num_requests):
                    tg.start_soon(engine.complete, [1, 5 + i, 9, 12], params)
            with anyio.fail_after(30):  # overshoot steps may still be in flight
                while engine.stats().pipeline_in_use:
                    await anyio.sleep(0.01)
            collector.cancel_scope.cancel()
        while True:  # steps launched but not yet taken by the collector
            try:
                watch(steps.receive_nowait())
            except anyio.WouldBlock:
                break
    return rows


def assert_in_order(rows: list[dict[str, Any]]) -> None:
    assert rows, "no step was watched"
    for row in rows:
        step: Step = row["step"]
        for k, state in enumerate(STATES):
            assert state in row, f"step {step.index}: {state} never resolved"
            seen = row[state]
            assert all(seen[: k + 1]), f"step {step.index}: {state} woke before {STATES[: k + 1]} were reached: {seen}"
        t = [step.planned.host_time, step.in_flight.host_time, step.committed.host_time]
        assert t[0] <= t[1] <= t[2], (step.index, t)


def test_states_resolve_in_order_and_show_the_overlap(tiny_llama: tuple[Path, Any]) -> None:
    path = str(tiny_llama[0])

    async def run(overlap: bool) -> list[dict[str, Any]]:
        async with aserve.Engine(model=path, overlap=overlap, warmup=False, debug=True) as engine:
            return await check_states(engine)

    for overlap in (False, True):
        rows = anyio.run(run, overlap)
        assert_in_order(rows)
        steps = [r["step"] for r in rows]
        # Overlap is visible in the states: the host planned step n+1 before step n committed.
        # Serially, never.
        ahead = [a.index for a, b in itertools.pairwise(steps) if b.planned.host_time < a.committed.host_time]
        if overlap:
            assert ahead, "overlap on, yet no step was planned before its predecessor committed"
        else:
            assert not ahead, f"serial mode planned steps {ahead} ahead of a commit"


def test_states_never_reached_raise_engine_closed_at_shutdown(
    tiny_llama: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = StepForward.run

    def slow(self: StepForward, dev: Any) -> Any:
        time.sleep(0.3)  # the "device" is still busy when the engine closes
        return real(self, dev)

    monkeypatch.setattr(StepForward, "run", slow)
    outcome: dict[str, Any] = {}

    async def wait_committed(step: Step) -> None:
        try:
            await step.committed.wait()
            outcome["error"] = None
        except BaseException as exc:
            outcome["error"] = exc

    async def run() -> None:
        with anyio.fail_after(30):  # a state that is never reached must not hang its waiter
            async with anyio.create_task_group() as tg:
                engine = aserve.Engine(model=str(tiny_llama[0]), warmup=False)
                await engine.start()  # start/aclose in one task, as an app without ``async with`` would
                async with engine.watch_steps() as steps:
                    engine.open_stream([1, 5, 9], aserve.SamplingParams(max_tokens=50, ignore_eos=True))
                    step = await steps.receive()
                tg.start_soon(wait_committed, step)
                await anyio.sleep(0.01)
                assert not step.committed.done()
                await engine.aclose()
        outcome["ledger"] = engine.ledger()

    anyio.run(run)
    assert isinstance(outcome["error"], aserve.EngineClosedError)
    assert outcome["ledger"].all_free and outcome["ledger"].balanced


def test_trace_draws_each_steps_states(tiny_llama: tuple[Path, Any], tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"

    async def run() -> int:
        async with aserve.Engine(model=str(tiny_llama[0]), warmup=False, trace_path=str(trace)) as engine:
            await engine.complete([1, 5, 9], aserve.SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
            return engine.stats().num_steps

    num_steps = anyio.run(run)
    events = json.loads(trace.read_text())["traceEvents"]
    spans: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for ev in events:
        if ev.get("cat") == "token states":
            spans.setdefault((ev["name"], ev["id"]), []).append(ev)
    for state in ("planned", "in-flight", "materialized", "committed"):
        ids = sorted(i for (name, i) in spans if name == state)
        assert len(ids) == num_steps, (state, ids, num_steps)
        for i in ids:
            begin, end = sorted(spans[(state, i)], key=lambda e: e["ph"])  # "b" before "e"
            assert begin["ph"] == "b" and end["ph"] == "e" and end["ts"] >= begin["ts"]
    device = [ev for ev in events if ev.get("ph") == "X" and ev.get("tid") == 2]
    assert len(device) == num_steps

"""Structured outputs on CUDA: the split launch (a constrained step's forward launched at once,
its sampler once the step before it is committed and the masks are filled) against serial mode,
with the in-place bitmask kernel, on the decode graphs and the eager path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import aserve
from aserve.sampling_params import StructuredOutputs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PATTERN = r"[0-9]{3}-[a-z]{2,6}\."


async def _outputs(engine: aserve.Engine, jobs: list[tuple[str, aserve.SamplingParams]]) -> list[Any]:
    """Each job's output, all completed concurrently; then (bounded) every request's KV back."""
    outs: list[Any] = [None] * len(jobs)

    async def one(i: int) -> None:
        outs[i] = (await engine.complete(*jobs[i])).outputs[0]

    async with anyio.create_task_group() as tg:
        for i in range(len(jobs)):
            tg.start_soon(one, i)
    with anyio.fail_after(60):
        while not engine.ledger().all_free:
            await anyio.sleep(0.01)
    return outs


@pytest.mark.parametrize("opts", [{}, {"cuda_graph": False}], ids=["defaults", "eager"])
def test_split_launch_matches_serial_and_keeps_the_grammar(tiny_llama: tuple[Path, Any], opts: dict[str, Any]) -> None:
    regex = StructuredOutputs(regex=PATTERN)

    def params(i: int) -> aserve.SamplingParams:
        return aserve.SamplingParams(max_tokens=40, temperature=0.0 if i % 2 else 1.0, seed=i, structured_outputs=regex)

    jobs = [(f"request {i}:", params(i)) for i in range(24)]
    free = aserve.SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    # Penalised neighbours: at depth 3 (the defaults) steps planned while a split one waits
    # build their inputs with the plan (a pending output must not be counted twice).
    penal = aserve.SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, frequency_penalty=1.5,
                                  repetition_penalty=1.3)  # fmt: skip

    async def run(overlap: bool) -> tuple[list[Any], list[list[int]], int, int, int]:
        async with aserve.Engine(model=str(tiny_llama[0]), device="cuda", max_context=128, kv_cache_bytes=2**26,
                                 overlap=overlap, debug=True, **opts) as engine:  # fmt: skip
            outs: list[Any] = [None] * len(jobs)
            plain: list[list[int]] = [[], [], []]

            async def one(i: int) -> None:
                outs[i] = (await engine.complete(*jobs[i])).outputs[0]

            async def unconstrained(k: int) -> None:
                params = free if k == 0 else penal
                plain[k] = list((await engine.complete(f"a neighbour {k}", params)).outputs[0].token_ids)

            async with anyio.create_task_group() as tg:
                for k in range(len(plain)):
                    tg.start_soon(unconstrained, k)
                for i in range(len(jobs)):
                    tg.start_soon(one, i)
            with anyio.fail_after(60):
                while not engine.ledger().all_free:
                    await anyio.sleep(0.01)
            loop = engine._loop
            return outs, plain, engine.runner.split_steps, loop.planned_ahead, loop.early_samplers

    serial, plain_serial, split_serial, _, _ = anyio.run(run, False)
    overlap, plain_overlap, split_overlap, ahead, early = anyio.run(run, True)
    assert split_serial == 0 and split_overlap > 0
    # Each split step's sampler went between the grammar advance and the rest of the commit
    # before it (StepLoop.early_samplers), and the tokens are still serial's.
    assert early > 0
    # Planning ahead of a split step's sampler needs a third slot (depth 3: CUDA graphs on),
    # and happens only when the planner gets there before that step's commit.
    assert opts == {} or ahead == 0, ahead
    for s, o in zip(serial, overlap, strict=True):
        assert s.token_ids == o.token_ids and s.finish_reason == o.finish_reason
        assert o.finish_reason == "stop" and re.fullmatch(PATTERN, o.text), (o.finish_reason, o.text)
    assert plain_serial == plain_overlap  # an unconstrained neighbour is unchanged


@pytest.mark.parametrize("fused", [True, False], ids=["fused-argmax", "masks-in-place"])
def test_greedy_constrained_rows_take_the_masked_argmax_after_the_decode_graph(
    tiny_llama: tuple[Path, Any], fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All-greedy steps with constrained rows replay the decode graph and take the argmax of
    the masked logits (no sampler inputs), from the fused kernel pair or the masks applied in
    place (a step's constrained rows against ``FUSED_ARGMAX_ROWS``); eager and serial,
    through the sampler, is the reference. With overlap the steps split (masks after the
    commit they need)."""
    from aserve.device import forward

    monkeypatch.setattr(forward, "FUSED_ARGMAX_ROWS", 1 if fused else 10**9)
    regex = StructuredOutputs(regex=PATTERN)
    jobs = [(f"request {i}:", aserve.SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=regex))
            for i in range(24)]  # fmt: skip
    jobs += [(f"free {i}:", aserve.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)) for i in range(4)]

    async def run(overlap: bool, graphs: bool) -> tuple[list[Any], int, int]:
        async with aserve.Engine(model=str(tiny_llama[0]), device="cuda", max_context=128, kv_cache_bytes=2**26,
                                 overlap=overlap, debug=True, cuda_graph=graphs, dtype="float32") as engine:  # fmt: skip
            outs = await _outputs(engine, jobs)
            return outs, engine.runner.masked_graph_steps, engine.runner.split_steps

    reference, masked_ref, _ = anyio.run(run, False, False)
    assert masked_ref == 0
    for overlap in (False, True):
        outs, masked, split = anyio.run(run, overlap, True)
        assert masked > 0 and (split > 0) == overlap
        for r, o in zip(reference, outs, strict=True):
            assert r.token_ids == o.token_ids and r.finish_reason == o.finish_reason
        for o in outs[:24]:
            assert o.finish_reason == "stop" and re.fullmatch(PATTERN, o.text), (o.finish_reason, o.text)


def test_a_split_step_whose_rows_are_all_constrained_samples_from_the_masked_argmax_graph(
    tiny_llama: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row of a greedy decode step constrained, overlap on: a split step's sampler is
    its size's masked-argmax graph (one replay), and the tokens are those of the eager launch
    (ASERVE_SAMPLER_GRAPH=0) and of serial mode without graphs, through the sampler. Two
    grammars, lengths that differ, so the batch shrinks through the ladder's sizes. The masks
    fill on llguidance's pool (its row minimum lowered for 20 rows, the mask cache off after
    the first token), beside the rest of the commit before (StepLoop.fill_beside), and with
    that off (ASERVE_FILL_BESIDE=0)."""
    from aserve.sampling import masks

    monkeypatch.setattr(masks, "_MIN_POOL_ROWS", 2)
    monkeypatch.setattr(masks, "MASK_CACHE_PREFIX", 0)  # rows computed, not copied from the cache
    monkeypatch.setenv("ASERVE_MASK_FILL", "executor:2")
    jobs = []
    for i in range(20):
        so = StructuredOutputs(regex=PATTERN) if i % 2 else StructuredOutputs(choice=("alpha", "beta", "gamma delta"))
        jobs.append(
            (f"item {i} is", aserve.SamplingParams(max_tokens=8 + 3 * i, temperature=0.0, structured_outputs=so))
        )

    async def run(overlap: bool, graphs: bool) -> tuple[list[Any], int, int, int]:
        async with aserve.Engine(model=str(tiny_llama[0]), device="cuda", max_context=128, kv_cache_bytes=2**26,
                                 overlap=overlap, debug=True, cuda_graph=graphs) as engine:  # fmt: skip
            outs = await _outputs(engine, jobs)
            g, beside = engine.runner.decode_graphs, engine._loop.fill_beside
            return (outs, 0 if g is None else g.masked_runs, engine.runner.split_steps,
                    -1 if beside is None else beside.runs)  # fmt: skip

    reference, _, _, _ = anyio.run(run, False, False)
    replayed, runs, split, beside_runs = anyio.run(run, True, True)
    assert runs > 0 and split > 0 and beside_runs > 0
    monkeypatch.setenv("ASERVE_FILL_BESIDE", "0")
    in_turn, runs_in_turn, _, beside_off = anyio.run(run, True, True)
    assert runs_in_turn > 0 and beside_off == -1
    monkeypatch.delenv("ASERVE_FILL_BESIDE")
    monkeypatch.setenv("ASERVE_SAMPLER_GRAPH", "0")
    eager, runs_off, split_off, beside_eager = anyio.run(run, True, True)
    assert runs_off == 0 and split_off > 0 and beside_eager > 0
    for r, o, t, e in zip(reference, replayed, in_turn, eager, strict=True):
        assert r.token_ids == o.token_ids == t.token_ids == e.token_ids
        assert r.finish_reason == o.finish_reason == t.finish_reason == e.finish_reason


def _automata_engine(tiny_llama: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch, overlap: bool,
                     graphs: bool) -> aserve.Engine:  # fmt: skip
    """The tiny model on CUDA: with ``graphs``, the defaults (token automata on); without,
    llguidance alone (``ASERVE_GRAMMAR_FSM=0``) and no CUDA graphs, the automata tests' reference."""
    if graphs:
        monkeypatch.delenv("ASERVE_GRAMMAR_FSM", raising=False)
    else:
        monkeypatch.setenv("ASERVE_GRAMMAR_FSM", "0")
    return aserve.Engine(model=str(tiny_llama[0]), device="cuda", max_context=128, kv_cache_bytes=2**26,
                         overlap=overlap, debug=True, cuda_graph=graphs)  # fmt: skip


def test_a_token_automatons_masks_gathered_on_the_device_draw_llguidances_tokens(
    tiny_llama: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token automata, on by default on a GPU; every row of a greedy step in one automaton (a
    JSON schema of aserve.sampling.fsm's subset). By default each step is launched whole, its
    rows' automaton states kept on the device (aserve.device.automata: ``fsm_device_steps``,
    no split step); with ``ASERVE_FSM_ON_DEVICE=0`` a split step's masked argmax reads its
    masks gathered on the device from the automaton's table (``fsm_gathers``). The reference
    is llguidance alone (``ASERVE_GRAMMAR_FSM=0``) in serial mode without graphs, filling
    masks on the host through the sampler. Same tokens; the outputs validate, seeded sampled
    ones on the device path too."""
    import json

    import jsonschema

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
              "ok": {"type": "boolean"}}, "required": ["n", "ok"], "additionalProperties": False}  # fmt: skip
    spec = StructuredOutputs(json=schema)
    jobs = [(f"item {i}:", aserve.SamplingParams(max_tokens=24 + i, temperature=0.0, structured_outputs=spec))
            for i in range(20)]  # fmt: skip
    sampled = [(f"item {i}:", aserve.SamplingParams(max_tokens=40, temperature=1.0, seed=i, structured_outputs=spec))
               for i in range(20)]  # fmt: skip

    async def run(overlap: bool, graphs: bool, jobs: list[Any] = jobs) -> tuple[list[Any], int, int, int, int]:
        async with _automata_engine(tiny_llama, monkeypatch, overlap, graphs) as engine:
            await engine.prepare_structured_outputs(spec)
            r = engine.runner
            outs = await _outputs(engine, jobs)
            return outs, r.fsm_gathers, r.fsm_device_steps, r.split_steps, r.automata.one_launch_steps

    reference, gathers_ref, on_device_ref, _, _ = anyio.run(run, False, False)
    assert gathers_ref == 0 and on_device_ref == 0
    # The defaults: a whole greedy step drawn in one launch (masks, masked argmax, next states).
    on_device, gathers, on_device_steps, split, one_launch = anyio.run(run, True, True)
    assert on_device_steps > 0 and split == 0 and gathers == 0 and 0 < one_launch <= on_device_steps
    monkeypatch.setenv("ASERVE_FSM_ONE_LAUNCH", "0")  # the three apart
    apart, gathers, on_device_steps, split, one_launch = anyio.run(run, True, True)
    assert on_device_steps > 0 and split == 0 and gathers == 0 and one_launch == 0
    monkeypatch.delenv("ASERVE_FSM_ONE_LAUNCH")
    monkeypatch.setenv("ASERVE_FSM_ON_DEVICE", "0")
    gathered, gathers, on_device_steps, split, _ = anyio.run(run, True, True)
    assert gathers > 0 and split > 0 and on_device_steps == 0
    for r, o, a, g in zip(reference, on_device, apart, gathered, strict=True):
        assert r.token_ids == o.token_ids == a.token_ids == g.token_ids
        assert r.finish_reason == o.finish_reason == a.finish_reason == g.finish_reason
        if o.finish_reason == "stop":
            jsonschema.validate(json.loads(o.text), schema)
    monkeypatch.delenv("ASERVE_FSM_ON_DEVICE")
    drawn, _, on_device_steps, split, one_launch = anyio.run(run, True, True, sampled)
    assert on_device_steps > 0 and split == 0 and one_launch == 0  # sampled: the sampler takes the masks
    assert sum(o.finish_reason == "stop" for o in drawn) >= len(drawn) // 2
    for o in drawn:
        if o.finish_reason == "stop":
            jsonschema.validate(json.loads(o.text), schema)


def test_automaton_rows_beside_llguidance_rows_keep_their_states_on_the_device(
    tiny_llama: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of two automata (a JSON schema, a choice) beside regex rows that only llguidance
    constrains: while the regex requests run, steps are split and the automaton rows' states
    are moved on on the device after each draw (``AutomatonRows.track``, the masked-argmax
    graph's and the eager sampler's); once they end, the steps are launched whole, two
    automata in one step. The reference is llguidance alone in serial mode without graphs."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}  # fmt: skip
    specs = [StructuredOutputs(json=schema), StructuredOutputs(choice=("alpha", "beta", "gamma delta"))]
    jobs = [(f"item {i}:", aserve.SamplingParams(max_tokens=30, temperature=0.0, structured_outputs=specs[i % 2]))
            for i in range(16)]  # fmt: skip
    jobs += [(f"code {i}:", aserve.SamplingParams(max_tokens=6, temperature=0.0,
              structured_outputs=StructuredOutputs(regex=PATTERN))) for i in range(8)]  # fmt: skip

    async def run(overlap: bool, graphs: bool) -> tuple[list[Any], int, int, int]:
        async with _automata_engine(tiny_llama, monkeypatch, overlap, graphs) as engine:
            await engine.prepare_structured_outputs(*specs)
            r = engine.runner
            return await _outputs(engine, jobs), r.fsm_device_steps, r.split_steps, r.automata.one_launch_steps

    reference, _, _, _ = anyio.run(run, False, False)
    outs, whole, split, one_launch = anyio.run(run, True, True)
    assert whole > 0 and split > 0 and 0 < one_launch <= whole, (whole, split, one_launch)
    for r, o in zip(reference, outs, strict=True):
        assert r.token_ids == o.token_ids and r.finish_reason == o.finish_reason

"""Structured outputs on the default model: every output is in its language, checked by an
independent validator (``jsonschema``, ``re``), with overlap on and off, through aborts and
retraction, and a bad grammar is a typed error before anything runs."""

from __future__ import annotations

import json
import random
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import jsonschema
import pytest

import aserve
from aserve.sampling_params import StructuredOutputs
from tests.hosting import hosted_engine

# Ten schemas: nested objects, enums, arrays, bounded numbers. Lengths are bounded so that
# every output can close within MAX_TOKENS (a cut-off JSON text would not parse).
NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}},
     "required": ["sentiment"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                               "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -50, "maximum": 50}, "y": {"type": "integer", "minimum": -50, "maximum": 50}},
        "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "code": {"type": "integer", "minimum": 100, "maximum": 599}},
     "required": ["ok", "code"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"city": NAME, "country": {"enum": ["FR", "DE", "IT"]}},
     "required": ["city", "country"], "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1,
     "maximum": 9999}, "roles": {"type": "array", "items": {"enum": ["admin", "dev"]}, "maxItems": 2}},
     "required": ["id", "roles"], "additionalProperties": False}}, "required": ["user"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"enum": [1, 2, 3]}},
     "required": ["answer", "confidence"], "additionalProperties": False},
    {"type": "object", "properties": {"title": NAME, "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
     "genres": {"type": "array", "items": {"enum": ["drama", "comedy"]}, "maxItems": 2}},
     "required": ["title", "year", "genres"], "additionalProperties": False},
]  # fmt: skip
MAX_TOKENS = 160  # (the retraction test clips it to its 208-token context)
PROMPTS = ["Extract the data as JSON:", "Answer in JSON.", "Here is a record:", "JSON output:"]


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[aserve.Engine]:
    async with hosted_engine(model="gemma-3-270m", num_threads=2) as eng:
        yield eng


def _params(so: StructuredOutputs, seed: int | None, temperature: float = 1.0) -> aserve.SamplingParams:
    return aserve.SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=seed, structured_outputs=so)


async def _settled(engine: aserve.Engine) -> bool:
    """Whether every KV page and row comes back once the engine has committed what is in flight:
    a constrained request that ended may still have one more token launched (its overshoot),
    whose step commits after ``complete`` returned."""
    with anyio.move_on_after(60):
        while not engine.ledger().all_free:
            await anyio.sleep(0.01)
    return engine.ledger().all_free


async def _run_all(engine: aserve.Engine, jobs: list[tuple[str, aserve.SamplingParams]]) -> list[Any]:
    results: list[Any] = [None] * len(jobs)

    async def one(i: int) -> None:
        prompt, params = jobs[i]
        results[i] = (await engine.complete(prompt, params)).outputs[0]

    async with anyio.create_task_group() as tg:
        for i in range(len(jobs)):
            tg.start_soon(one, i)
    return results


@pytest.mark.slow
async def test_100_sampled_requests_against_10_schemas_all_validate(engine: aserve.Engine) -> None:
    rng = random.Random(0)
    jobs = [
        (
            rng.choice(PROMPTS),
            _params(StructuredOutputs(json=SCHEMAS[i % 10]), seed=i, temperature=rng.choice([0.7, 1.0])),
        )
        for i in range(100)
    ]
    outs = await _run_all(engine, jobs)
    for i, out in enumerate(outs):
        assert out.finish_reason == "stop", (i, out.text)
        jsonschema.validate(json.loads(out.text), SCHEMAS[i % 10])
    assert await _settled(engine)


async def test_properties_come_in_the_schemas_order(engine: aserve.Engine) -> None:
    """As OpenAI's structured outputs do (and a tool call's "name" must come before its
    "arguments" for them to stream): not sorted, not in the model's order of choice."""
    props = {"zeta": {"enum": ["x", "y"]}, "alpha": {"type": "boolean"}, "mid": {"enum": [1, 2]}}
    schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    outs = await _run_all(engine, [(p, _params(StructuredOutputs(json=schema), seed=k)) for k, p in enumerate(PROMPTS)])
    for out in outs:
        assert out.finish_reason == "stop", out.text
        assert [k for k, _ in json.loads(out.text, object_pairs_hook=list)] == list(props), out.text


async def test_regex_choice_json_object_and_grammar(engine: aserve.Engine) -> None:
    phone = r"\(\d{3}\) \d{3}-\d{4}"
    choices = ("red", "green", "blue")
    lark = 'start: "The answer is " ANSWER "."\nANSWER: "yes" | "no"'
    jobs = []
    for seed in range(6):
        jobs.append(("Call me at", _params(StructuredOutputs(regex=phone), seed)))
        jobs.append(("My favourite colour:", _params(StructuredOutputs(choice=choices), seed)))
        jobs.append(("A JSON object:", _params(StructuredOutputs(json_object=True), seed, temperature=0.0)))
        jobs.append(("Is it true?", _params(StructuredOutputs(grammar=lark), seed)))
    outs = await _run_all(engine, jobs)
    for k in range(0, len(outs), 4):
        assert re.fullmatch(phone, outs[k].text), outs[k].text
        assert outs[k + 1].text in choices
        if outs[k + 2].finish_reason == "stop":  # greedy JSON may run long; when complete it parses
            assert isinstance(json.loads(outs[k + 2].text), dict)
        assert re.fullmatch(r"The answer is (yes|no)\.", outs[k + 3].text), outs[k + 3].text
    # One string is one choice (as ``stop`` takes one string), not its characters.
    assert StructuredOutputs(choice="yes").choice == ("yes",)
    one = await engine.complete("Pick:", _params(StructuredOutputs(choice="maybe"), 0, temperature=0.0))
    assert one.text == "maybe"
    assert await _settled(engine)


async def test_unconstrained_requests_in_the_same_batch_are_unchanged() -> None:
    """Grammars on the other rows leave an unconstrained row's tokens as they are alone. On an
    engine whose numbers do not depend on the batch: by default a CPU with AVX-512 BF16
    multiplies steps of 7+ rows in bfloat16 (EngineConfig.gguf_prefill), so there a request's
    last bits, and at a near tie its tokens, can move with the batch's size."""
    plain = aserve.SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    so = _params(StructuredOutputs(choice=("yes", "no")), seed=1)
    async with hosted_engine(model="gemma-3-270m", num_threads=2, gguf_prefill="float32") as engine:
        alone = (await engine.complete("The capital of France is", plain)).token_ids
        mixed = await _run_all(engine, [("The capital of France is", plain), ("Yes or no?", so), ("Maybe?", so)])
        assert mixed[0].token_ids == alone
        assert mixed[1].text in ("yes", "no") and mixed[2].text in ("yes", "no")
        assert await _settled(engine)


async def test_a_bad_grammar_is_a_typed_error_before_anything_runs(engine: aserve.Engine) -> None:
    for so in (
        StructuredOutputs(regex="([a-z"),
        StructuredOutputs(json={"type": "no-such-type"}),
        StructuredOutputs(grammar="start: @@@"),
    ):
        with pytest.raises(aserve.InvalidRequestError) as info:
            await engine.complete("x", _params(so, seed=0))
        assert info.value.param == "structured_outputs"
    for bad in ({}, {"regex": "a", "choice": ["b"]}, {"choice": []}, {"nonsense": 1}):
        with pytest.raises(aserve.InvalidRequestError):
            aserve.SamplingParams(structured_outputs=bad)  # type: ignore[arg-type]
    assert engine.ledger().all_free


async def test_greedy_constrained_output_is_the_same_with_overlap_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [
        (p, _params(StructuredOutputs(json=SCHEMAS[i]), seed=None, temperature=0.0)) for i, p in enumerate(PROMPTS * 2)
    ]
    texts = {}
    # Depth 3 (CUDA's default): the step after a split one is planned while that one's
    # sampler waits for the commit before it (StepLoop.planned_ahead), and launched between
    # that commit's grammar advance and its rest (StepLoop.launched_behind); "late": the
    # sampler and that launch wait for the whole commit (ASERVE_EARLY_SAMPLER=0).
    for overlap, depth in ((False, None), (True, 2), (True, 3), (True, "late")):
        monkeypatch.setenv("ASERVE_EARLY_SAMPLER", "0" if depth == "late" else "1")
        async with aserve.Engine(model="gemma-3-270m", num_threads=2, overlap=overlap,
                                 overlap_depth=3 if depth == "late" else depth, debug=True) as eng:  # fmt: skip
            states: list[list[str]] = []
            split: list[Any] = []

            async def watch(steps: Any, states: list[list[str]] = states, split: list[Any] = split) -> None:
                # Every step's four states resolve, in order, split launches included (their
                # materialized/copied events exist before their sampler is launched).
                async for step in steps:
                    seen = []
                    for name in ("planned", "in_flight", "materialized", "committed"):
                        await getattr(step, name).wait()
                        seen.append(name)
                    states.append(seen)
                    if step.split_gap is not None:
                        split.append(step)

            async with eng.watch_steps() as steps, anyio.create_task_group() as tg:
                tg.start_soon(watch, steps)
                texts[depth] = [(o.token_ids, o.finish_reason) for o in await _run_all(eng, jobs)]
                assert await _settled(eng)
                tg.cancel_scope.cancel()
            # Under overlap, constrained steps launch in two (the sampler after the commit its
            # masks need); serially there is never an earlier step in flight.
            assert (eng.runner.split_steps > 0) == overlap, eng.runner.split_steps
            loop = eng._loop
            assert (loop.planned_ahead > 0) == (depth in (3, "late")), loop.planned_ahead
            assert (loop.early_samplers > 0) == (overlap and depth != "late"), loop.early_samplers
            assert (loop.launched_behind > 0) == (depth == 3), loop.launched_behind
            assert states and all(len(s) == 4 for s in states)
            # A split step's device time leaves out its wait between forward and sampler, which
            # counts as idle (the events' host stamps on a CPU).
            assert bool(split) == overlap
            records = {r.index: r for r in eng.step_records()}
            for step in split:
                fwd_end, sampler_begin = step.split_gap
                waited = sampler_begin.host_time - fwd_end.host_time
                span = step.materialized.host_time - step.forward_begin.host_time
                rec = records[step.index]
                assert waited >= 0 and rec.device_busy_s == pytest.approx(span - waited)
                assert rec.device_gap_s is not None and rec.device_gap_s >= waited
    assert texts[None] == texts[2] == texts[3] == texts["late"]


async def test_automaton_constrained_outputs_are_llguidances_token_for_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Specs in aserve.sampling.fsm's subset, constrained by their token automata
    (``ASERVE_GRAMMAR_FSM=1``; the default on a GPU), give the same tokens as llguidance alone,
    greedy and seeded (the automaton's masks are llguidance's), with overlap on and off; the
    outputs validate. Their states live on the device (aserve.device.automata). Prompts are
    admitted a few a step (a small token budget), and regex requests (llguidance's alone)
    share the first steps: those are split, the automaton rows' states moved on after each
    draw, and once the regex requests end the steps are launched whole."""
    from aserve.sampling.fsm import FsmState

    specs = [StructuredOutputs(json=SCHEMAS[i]) for i in (1, 3, 5, 8)] + [
        StructuredOutputs(choice=("yes", "no", "maybe"))
    ]
    regex = StructuredOutputs(regex=r"[a-z]{2,5}-[0-9]{2}")
    jobs = [(p, _params(spec, seed=k, temperature=0.0 if k % 2 else 1.0)) for k, p in enumerate(PROMPTS)
            for spec in specs]  # fmt: skip
    jobs += [(f"Code {k}:", aserve.SamplingParams(max_tokens=6, temperature=0.0, structured_outputs=regex))
             for k in range(4)]  # fmt: skip
    outs = {}
    for fsm, overlap in (("0", True), ("1", False), ("1", True)):
        monkeypatch.setenv("ASERVE_GRAMMAR_FSM", fsm)
        async with aserve.Engine(model="gemma-3-270m", num_threads=2, overlap=overlap, max_num_batched_tokens=48,
                                 debug=True) as eng:  # fmt: skip
            grammars = eng._admission.grammars
            assert grammars is not None and (grammars.fsms is not None) == (fsm == "1")
            await eng.prepare_structured_outputs(*specs)
            states = [grammars.state(spec) for spec in specs]
            assert all(isinstance(st, FsmState) == (fsm == "1") for st in states)
            res = await _run_all(eng, jobs)
            outs[fsm, overlap] = [(o.token_ids, o.finish_reason) for o in res]
            for (_, params), out in zip(jobs, res, strict=True):
                spec = params.structured_outputs
                assert spec is not None
                if spec.choice is not None:
                    assert out.text in spec.choice, out.text
                elif spec.json is not None and out.finish_reason == "stop":
                    jsonschema.validate(json.loads(out.text), json.loads(str(spec.json)))
            assert sum(o.finish_reason == "stop" for o in res) >= len(res) // 2
            assert await _settled(eng)
            runner = eng.runner
            assert (runner.fsm_device_steps > 0) == (fsm == "1"), runner.fsm_device_steps
            assert (runner.split_steps > 0) == overlap, runner.split_steps
    assert outs["0", True] == outs["1", False] == outs["1", True]


async def test_a_decode_blocks_automaton_rows_stay_on_the_device_step_after_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Greedy requests of one schema and a choice decode as a block: once its members' states
    are on the device, a step with the same members as the one before reuses that step's
    rows (``fsm_steady_steps``) instead of reading each request again; when members leave or
    join, they are read again. The tokens are llguidance's alone, with overlap."""
    specs = [StructuredOutputs(json=SCHEMAS[i]) for i in (3, 8)] + [StructuredOutputs(choice=("yes", "no", "maybe"))]
    jobs = [(f"{p} {k}", aserve.SamplingParams(max_tokens=20 + 9 * k, temperature=0.0, structured_outputs=spec))
            for k, p in enumerate(PROMPTS) for spec in specs]  # fmt: skip
    outs = {}
    for fsm in ("0", "1"):
        monkeypatch.setenv("ASERVE_GRAMMAR_FSM", fsm)
        async with aserve.Engine(model="gemma-3-270m", num_threads=2, debug=True) as eng:
            await eng.prepare_structured_outputs(*specs)
            outs[fsm] = [(o.token_ids, o.finish_reason) for o in await _run_all(eng, jobs)]
            assert await _settled(eng)
            runner = eng.runner
            if fsm == "1":
                assert runner.fsm_steady_steps > 0 and runner.split_steps == 0
                assert runner.fsm_steady_steps < runner.fsm_device_steps  # members left: read again
    assert outs["0"] == outs["1"]


async def test_the_trace_shows_an_early_samplers_commit_in_two_parts(tmp_path: Any) -> None:
    """The commit before a split step yields once between its grammar advance and the rest:
    its trace has two commit spans, in order, and the step planned during the wait is
    launched in between (depth 3)."""
    trace = tmp_path / "trace.json"
    jobs = [(p, _params(StructuredOutputs(json=SCHEMAS[i]), seed=None, temperature=0.0)) for i, p in enumerate(PROMPTS)]
    async with aserve.Engine(model="gemma-3-270m", num_threads=2, overlap_depth=3, trace_path=str(trace)) as eng:
        await _run_all(eng, jobs)
        assert await _settled(eng)  # the last steps (overshoot only) committed, so traced
        early, behind = eng._loop.early_samplers, eng._loop.launched_behind
    assert early > 0 and behind > 0
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    commits: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e["name"] == "commit":
            commits.setdefault(e["args"]["step"], []).append((e["ts"], e["ts"] + e["dur"]))
    split = [sorted(parts) for parts in commits.values() if len(parts) == 2]
    assert len(split) == early and all(len(parts) <= 2 for parts in commits.values())
    assert all(first[1] <= second[0] for first, second in split)
    launches = [e["ts"] for e in events if e["name"] == "launch"]
    between = sum(any(first[1] <= t <= second[0] for t in launches) for first, second in split)
    assert between == behind


async def test_penalised_requests_beside_split_steps_at_depth_3_match_serial() -> None:
    """Depth 3 plans the step after a split one while that one's sampler waits for a commit;
    its inputs must be built in the same stretch as its plan (a penalised decode's pending
    output is decided there). Greedy rows with penalties beside constrained ones, against
    the same requests run serially. float32 prefills: the steps of the two runs hold
    different batches (a penalised decode waits out a step at depth 3), and the default
    bfloat16 prefill's rows depend on the batch."""
    penal = aserve.SamplingParams(max_tokens=24, temperature=0.0, frequency_penalty=1.5, presence_penalty=0.5,
                                  repetition_penalty=1.3, ignore_eos=True)  # fmt: skip
    jobs = [(p, _params(StructuredOutputs(json=SCHEMAS[i]), seed=None, temperature=0.0)) for i, p in enumerate(PROMPTS)]
    jobs += [(f"{p} {i}", penal) for i, p in enumerate(PROMPTS * 2)]
    runs = {}
    for overlap, depth in ((False, None), (True, 3)):
        async with aserve.Engine(model="gemma-3-270m", num_threads=2, overlap=overlap, overlap_depth=depth,
                                 debug=True, gguf_prefill="float32") as eng:  # fmt: skip
            runs[depth] = [(o.token_ids, o.finish_reason) for o in await _run_all(eng, jobs)]
            assert await _settled(eng)
            assert (eng._loop.planned_ahead > 0) == overlap, eng._loop.planned_ahead
    assert runs[None] == runs[3]


@pytest.mark.slow
async def test_masks_filled_on_llguidance_threads_draw_the_same_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 seeded sampled requests over the ten schemas: the engine filling its masks on
    llguidance's pool (requests spread over each grammar's templates) draws the tokens it
    draws with the serial fill. float32 steps, so a row's numbers do not depend on the batch."""
    pytest.importorskip("aserve.sampling._grammar_tokens")
    jobs = [(PROMPTS[i % 4], _params(StructuredOutputs(json=SCHEMAS[i % 10]), seed=i)) for i in range(40)]
    from aserve.sampling import grammar, masks

    monkeypatch.setattr(masks, "_MIN_POOL_ADVANCE", 32)  # the commit's advance on the pool too
    runs = {}
    for spec in ("serial", "executor:2"):
        monkeypatch.setenv("ASERVE_MASK_FILL", spec)  # read by the engine's MaskFiller.for_device
        async with hosted_engine(model="gemma-3-270m", num_threads=2, gguf_prefill="float32") as eng:
            grammars = eng._admission.grammars
            assert grammars is not None and grammars.filler.spec == spec
            filler = grammars.filler
            outs = await _run_all(eng, jobs)
            runs[spec] = [(o.token_ids, o.finish_reason) for o in outs]
            for i, o in enumerate(outs):
                assert o.finish_reason == "stop", (spec, i, o.text)
                jsonschema.validate(json.loads(o.text), SCHEMAS[i % 10])
            assert await _settled(eng)
            # The split steps' pool fills ran beside the rest of the commit before them.
            beside = eng._loop.fill_beside
            assert beside is not None and (beside.runs > 0) == (spec != "serial"), beside.runs
            if spec != "serial":
                assert filler._executor is not None, "no step had enough constrained rows for the pool"
                assert filler.pool_consumes > 0, "no commit advanced its grammar rows on the pool"
                templates = grammars._cache[StructuredOutputs(json=SCHEMAS[0]).key].templates
                # Its four requests took the grammar's templates in turn (TEMPLATES_PER_THREAD a thread).
                assert len(templates) == min(2 * grammar.TEMPLATES_PER_THREAD, 4)
    assert runs["serial"] == runs["executor:2"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("split", "depth", "fsm"),
    [("1", 2, "0"), ("0", 2, "0"), ("1", 3, "0"), ("1", 3, "1")],
    ids=["split-launch", "lookahead-zero", "split-launch-depth3", "automata-on-device"],
)
async def test_retraction_and_aborts_keep_outputs_valid_and_the_ledger_free(
    split: str, depth: int, fsm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pool of 10 pages of 16 tokens for 12 requests of ~60-80 tokens each: when they grow
    # some are retracted (their KV given back, recomputed later) while their grammars wait
    # at a committed state. (13 pages retracted nothing once the split launch let constrained
    # requests decode every step and end sooner.) With token automata (the default on a GPU)
    # the schemas of their subset keep their states on the device (aserve.device.automata):
    # a retracted request's row and generation change, so its next step starts from the host's.
    monkeypatch.setenv("ASERVE_SPLIT_MASKS", split)
    monkeypatch.setenv("ASERVE_GRAMMAR_FSM", fsm)
    per_token = 18 * 2 * 256 * 4  # Gemma 3 270M, float32: layers x (k, v) x head_dim x bytes
    async with aserve.Engine(model="gemma-3-270m", num_threads=2, kv_cache_bytes=per_token * 160,
                             max_context=160, debug=True, overlap_depth=depth) as eng:  # fmt: skip
        if fsm == "1":
            await eng.prepare_structured_outputs(*(StructuredOutputs(json=s) for s in SCHEMAS))
        # ~40-token prompts, each different (no shared prefix): 3-4 pages per request.
        jobs = [
            (f"Record {i}: " + "the quick brown fox jumps over a lazy dog " * 4 + PROMPTS[i % 4],
             _params(StructuredOutputs(json=SCHEMAS[i % 10]), seed=i))
            for i in range(12)
        ]  # fmt: skip

        async def abort_early(i: int) -> None:
            params = _params(StructuredOutputs(json=SCHEMAS[i]), seed=100 + i)
            with anyio.move_on_after(0):  # cancelled at its first checkpoint or soon after
                await eng.complete("Give JSON:", params)
            got = 0
            async for _ in eng.generate("Give JSON:", params):
                got += 1
                if got == 3:
                    break

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(abort_early, i)
            outs = await _run_all(eng, jobs)
        for i, out in enumerate(outs):
            assert out.finish_reason == "stop", (i, out.text)
            jsonschema.validate(json.loads(out.text), SCHEMAS[i % 10])
        assert eng.stats().num_retractions > 0  # the pool was too small: retraction happened
        # (Steps launched whole plan nothing ahead: only split ones do.)
        assert (eng._loop.planned_ahead > 0) == (depth == 3 and fsm == "0"), eng._loop.planned_ahead
        assert (eng.runner.fsm_device_steps > 0) == (fsm == "1"), eng.runner.fsm_device_steps
        with anyio.fail_after(30):
            while not eng.ledger().all_free:
                await anyio.sleep(0.05)


async def test_forced_bytes_on_a_vocabulary_with_a_dummy_prefix(tiny_llama: tuple[Any, Any]) -> None:
    # The tiny llama's sentencepiece vocabulary prepends "▁" to text: the "-" the regex forces
    # after three digits must not become the forced tokens "▁", "-" (the grammar rejected the
    # first and every output ended as "123 ").
    pattern = r"[0-9]{3}-[a-z]{2,6}\."
    async with aserve.Engine(model=str(tiny_llama[0]), max_context=128, kv_cache_bytes=2**26) as eng:
        jobs = [
            (f"request {i}:", _params(StructuredOutputs(regex=pattern), seed=i, temperature=i % 2)) for i in range(8)
        ]
        for out in await _run_all(eng, jobs):
            assert out.finish_reason == "stop" and re.fullmatch(pattern, out.text), out.text


async def test_constrained_greedy_rows_on_the_decode_graph_path_match_the_sampler(tiny_llama: tuple[Any, Any]) -> None:
    """Decode steps whose rows are greedy, some of them constrained, run from the decode graph
    (on a CPU its body on the static buffers) and take the argmax of the masked logits; the
    general sampler, serially and without graphs, is the reference. Split launches included."""
    pattern = r"[0-9]{3}-[a-z]{2,6}\."
    jobs = [(f"request {i}:", _params(StructuredOutputs(regex=pattern), seed=None, temperature=0.0)) for i in range(5)]
    jobs += [(f"free {i}:", aserve.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)) for i in range(3)]
    results = {}
    for overlap, graphs in ((False, False), (True, True), (False, True)):
        async with aserve.Engine(model=str(tiny_llama[0]), max_context=128, kv_cache_bytes=2**26, overlap=overlap,
                                 attention_backend="triton", cuda_graph=graphs, cuda_graph_max_tokens=0, debug=True,
                                 max_running_requests=8, warmup=False) as eng:  # fmt: skip
            outs = await _run_all(eng, jobs)
            results[overlap, graphs] = [(o.token_ids, o.finish_reason) for o in outs]
            for out in outs[:5]:
                assert out.finish_reason == "stop" and re.fullmatch(pattern, out.text), out.text
            if graphs:
                assert eng.runner.masked_graph_steps > 0
                assert (eng.runner.split_steps > 0) == overlap
            assert await _settled(eng)
    assert results[False, False] == results[True, True] == results[False, True]


async def test_the_grammar_tokenizer_is_built_off_the_loop_before_serving(tiny_llama: tuple[Any, Any]) -> None:
    """``prepare_structured_outputs`` (what ``aserve serve`` awaits before it says ready) builds
    llguidance's tokenizer on a worker thread; the first structured request then builds
    nothing on the loop, and gets the same output as an engine that built it there."""
    pattern = r"[0-9]{3}-[a-z]{2,6}\."
    jobs = [("request:", _params(StructuredOutputs(regex=pattern), seed=1, temperature=0))]
    outs = []
    for prepare in (True, False):
        async with aserve.Engine(model=str(tiny_llama[0]), max_context=128, kv_cache_bytes=2**26) as eng:
            grammars = eng._admission.grammars
            assert grammars is not None and grammars._ll_tokenizer is None  # lazy until asked
            if prepare:
                await eng.prepare_structured_outputs()
                assert grammars._ll_tokenizer is not None
            outs.append([o.text for o in await _run_all(eng, jobs)])
    assert outs[0] == outs[1] and re.fullmatch(pattern, outs[0][0])


async def test_automaton_rows_drawn_in_one_launch_match_llguidance(
    tiny_llama: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy decode-graph steps whose rows are all in token automata take their masks, masked
    argmax and next states in one kernel launch a automaton (a GPU's default; on a CPU the
    decode graph's body on its static buffers and Triton's interpreter,
    ``ASERVE_FSM_ONE_LAUNCH=1``): the same tokens as the three apart and as llguidance alone
    (serially, without graphs), with overlap, three automata in the batch beside free rows."""
    specs = [StructuredOutputs(json=SCHEMAS[i]) for i in (5, 8)] + [
        StructuredOutputs(choice=("alpha", "beta", "gamma"))
    ]
    jobs = [(f"request {i}:", aserve.SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=specs[i % 3]))
            for i in range(6)]  # fmt: skip
    jobs += [(f"free {i}:", aserve.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)) for i in range(2)]
    results = {}
    for fsm, one_launch, graphs in (("0", "0", False), ("1", "0", True), ("1", "1", True)):
        monkeypatch.setenv("ASERVE_GRAMMAR_FSM", fsm)
        monkeypatch.setenv("ASERVE_FSM_ONE_LAUNCH", one_launch)
        async with aserve.Engine(model=str(tiny_llama[0]), max_context=128, kv_cache_bytes=2**26, overlap=graphs,
                                 attention_backend="triton", cuda_graph=graphs, cuda_graph_max_tokens=0, debug=True,
                                 max_running_requests=8, warmup=False) as eng:  # fmt: skip
            await eng.prepare_structured_outputs(*specs)
            outs = await _run_all(eng, jobs)
            results[fsm, one_launch] = [(o.token_ids, o.finish_reason) for o in outs]
            for (_, params), out in zip(jobs[:6], outs, strict=False):
                spec = params.structured_outputs
                assert spec is not None
                if spec.choice is not None:
                    assert out.text in spec.choice, out.text
                elif out.finish_reason == "stop":
                    jsonschema.validate(json.loads(out.text), json.loads(str(spec.json)))
            runner = eng.runner
            assert (runner.fsm_device_steps > 0) == (fsm == "1"), runner.fsm_device_steps
            drawn = runner.automata.one_launch_steps
            assert (drawn > 0) == (one_launch == "1"), drawn
            assert await _settled(eng)
    assert results["0", "0"] == results["1", "0"] == results["1", "1"]

"""Token automata for regular structured outputs (aserve/sampling/fsm.py), checked against
independent references: integer ranges against arithmetic, walks through an automaton against
``jsonschema`` and against llguidance (which must accept every token the automaton allows),
on the default model's vocabulary."""

from __future__ import annotations

import json
import os
import random
import re
from typing import Any

import jsonschema
import pytest
import torch

from aserve.bench.mask_fill import _tokenizer
from aserve.sampling.fsm import FsmState, TokenFSM, build_fsm
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import GrammarState, MaskFiller, advance_all, allowed_tokens, fill_masks
from aserve.sampling.schema_regex import int_range_regex, schema_regex, spec_regex
from aserve.sampling_params import StructuredOutputs

# In the subset (each has a regex); the test module's engine schemas 2, 4, 6 and 9 among them.
SCHEMAS: list[dict[str, Any]] = [
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 3, "maxItems": 5},
    {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}},
     "required": ["sentiment"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -50, "maximum": 50}, "y": {"type": "integer", "minimum": -50, "maximum": 50}},
        "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "code": {"type": "integer", "minimum": 100, "maximum": 599},
     "note": {"type": "string", "minLength": 1, "maxLength": 6}, "tags": {"type": "array", "items": {"enum": ["a", "b"]},
     "maxItems": 2}, "none": {"type": "null"}}, "required": ["ok", "code", "note", "tags", "none"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"enum": [1, 2, 3]}},
     "required": ["answer", "confidence"], "additionalProperties": False},
]  # fmt: skip


@pytest.mark.parametrize("lo,hi", [(0, 0), (0, 9), (0, 999), (7, 12), (100, 599), (-50, 50), (-123, -7), (1900, 2030),
                                   (1, 9999), (-5, 0), (38, 4021)])  # fmt: skip
def test_an_integer_range_regex_matches_exactly_the_range(lo: int, hi: int) -> None:
    rx = re.compile(int_range_regex(lo, hi))
    for x in range(min(lo, 0) - 150, max(hi, 0) + 150):
        assert bool(rx.fullmatch(str(x))) == (lo <= x <= hi), (lo, hi, x)
    for text in ("00", "01", "007", "+1", "-00", ""):
        assert not rx.fullmatch(text)
    assert bool(rx.fullmatch("-0")) == (lo < 0 <= hi)  # JSON's -0, where llguidance allows it


def test_schemas_outside_the_subset_stay_with_llguidance() -> None:
    assert schema_regex({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}) is None
    assert (
        schema_regex({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False})
        is None
    )
    assert schema_regex({"type": "integer", "minimum": 0}) is None
    assert schema_regex({"type": "number", "maximum": 3}) is None
    assert schema_regex({"type": "string", "pattern": "a+"}) is None
    assert schema_regex({"type": "string", "maxLength": 1000}) is None
    assert schema_regex({"anyOf": [{"type": "integer"}, {"type": "null"}]}) is None
    assert schema_regex({"$ref": "#/$defs/x"}) is None
    assert spec_regex(StructuredOutputs(regex="a+")) is None  # llguidance's regex dialect is its own
    assert spec_regex(StructuredOutputs(grammar='start: "a"')) is None


@pytest.fixture(scope="module")
def vocab() -> tuple[Any, Grammars]:
    tok = _tokenizer(None)
    return tok, Grammars(tok, tok.vocab_size, filler=MaskFiller("serial"), fsm=False)


def _judge(grammars: Grammars, spec: StructuredOutputs) -> GrammarState:
    """llguidance's state for ``spec`` at its start (the reference)."""
    return grammars.state(spec, MaskFiller("serial"), cached=False)


def _fsm(tok: Any, grammars: Grammars, spec: StructuredOutputs, regex: str | None = None) -> TokenFSM | None:
    """``spec``'s automaton (of ``regex`` if given) with llguidance's masks, as an engine builds it."""
    special = [i for i in range(tok.vocab_size) if tok.is_special(i)]
    regex = spec_regex(spec) if regex is None else regex
    assert regex is not None
    judge = _judge(grammars, spec)
    return build_fsm(regex, tok.token_bytes(), special, list(tok.eos_token_ids), tok.vocab_size, judge)


def _allowed(state: GrammarState) -> torch.Tensor:
    return allowed_tokens(fill_masks([state]), state.vocab_size)[0].nonzero().flatten()


def _walk(tok: Any, fsm: TokenFSM, judge: GrammarState, seed: int, pick: Any, steps: int = 400) -> bytes:
    """Walk ``fsm`` and llguidance's ``judge`` side by side, ``pick(rng, step, allowed ids)``
    choosing each token; at every step both masks must be equal, bit for bit. The automaton
    on the device (aserve.device.automata; here the CPU) walks beside them: its state is the
    host's, and its mask the host's, at every step. The text walked."""
    rng = random.Random(seed)
    state = FsmState(fsm, tok.vocab_size)
    token_bytes, eos = tok.token_bytes(), set(tok.eos_token_ids)
    tables = fsm.on_device(torch.device("cpu"))
    on_device = torch.tensor([fsm.number_of(state)])
    text = b""
    for step in range(steps):
        assert state.done == judge.done, text
        if state.done:
            break
        ours, theirs = fill_masks([state]), fill_masks([judge])
        assert torch.equal(ours, theirs), (text, sorted(token_bytes[t] for t in allowed_tokens(theirs ^ ours, tok.vocab_size)[0].nonzero().flatten().tolist())[:8])  # fmt: skip
        assert torch.equal(tables.masks_of(on_device), ours), text
        ids = _allowed(state).tolist()
        assert ids, "a state that allows nothing"
        token = pick(rng, step, ids)
        assert judge.advance(token), (text, token_bytes[token], judge.error)
        assert state.advance(token) and not state.error
        on_device = tables.step(on_device, torch.tensor([token]))
        # The same state; an end-of-sequence token's is the device's own ended state.
        want = tables.done if token in eos else fsm.numbers[state.state]
        assert int(on_device) == want, (text, token_bytes[token])
        assert torch.equal(tables.masks_of(on_device), fill_masks([state])), text  # a done one's: every token
        if token in eos:
            break
        text += token_bytes[token]
    assert state.done and judge.done, text
    return text


@pytest.mark.slow
@pytest.mark.parametrize("which", range(len(SCHEMAS)))
def test_walks_through_a_schemas_automaton_give_llguidances_masks_and_valid_json(
    vocab: tuple[Any, Grammars], which: int
) -> None:
    tok, grammars = vocab
    schema = SCHEMAS[which]
    spec = StructuredOutputs(json=schema)
    fsm = _fsm(tok, grammars, spec)
    assert fsm is not None
    eos = set(tok.eos_token_ids)

    def pick(rng: random.Random, step: int, ids: list[int]) -> int:
        # Short outputs: take an end-of-sequence token where one is allowed, half the time.
        ends = [t for t in ids if t in eos]
        return ends[0] if ends and rng.random() < 0.5 else rng.choice(ids)

    for walk in range(6):
        text = _walk(tok, fsm, _judge(grammars, spec), walk, pick)
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("lo,hi", [(0, 9), (-50, 50), (-5, 0), (-123, -7)])
def test_an_integer_ranges_automaton_has_llguidances_masks(vocab: tuple[Any, Grammars], lo: int, hi: int) -> None:
    """Built, that is: llguidance allows nothing the range's regex leaves out (``-0`` where the
    range holds 0 and a negative, as llguidance allows it), and walks see the same masks."""
    tok, grammars = vocab
    spec = StructuredOutputs(json={"type": "integer", "minimum": lo, "maximum": hi})
    fsm = _fsm(tok, grammars, spec)
    assert fsm is not None
    eos = set(tok.eos_token_ids)
    ended = 0

    def pick(rng: random.Random, step: int, ids: list[int]) -> int:
        # Every other walk takes an end-of-sequence token where one is allowed (after "5" of
        # -50..50): its last step reaches the automaton's ended state on the device.
        nonlocal ended
        ends = [t for t in ids if t in eos]
        if ends and walk % 2:
            ended += 1
            return ends[0]
        return rng.choice(ids)

    for walk in range(8):
        _walk(tok, fsm, _judge(grammars, spec), walk, pick)
    assert ended > 0 or hi - lo < 10  # (a single digit ends those)


def test_an_automaton_narrower_than_its_grammar_is_not_used(vocab: tuple[Any, Grammars]) -> None:
    tok, grammars = vocab
    spec = StructuredOutputs(json={"type": "integer", "minimum": 0, "maximum": 99})
    assert _fsm(tok, grammars, spec) is not None
    assert _fsm(tok, grammars, spec, regex=int_range_regex(0, 9)) is None  # llguidance allows "10"
    choice = StructuredOutputs(choice=["red", "green"])
    assert _fsm(tok, grammars, choice, regex="(red|gre)") is None


def test_a_choices_automaton_and_its_state(vocab: tuple[Any, Grammars]) -> None:
    tok, grammars = vocab
    spec = StructuredOutputs(choice=["red", "green", "a.b"])
    regex = spec_regex(spec)
    assert regex is not None and re.fullmatch(regex, "a.b") and not re.fullmatch(regex, "axb")
    fsm = _fsm(tok, grammars, spec)
    assert fsm is not None
    state = FsmState(fsm, tok.vocab_size)
    token_bytes = tok.token_bytes()
    first = {token_bytes[t] for t in _allowed(state).tolist()}
    assert first and all(any(c.encode().startswith(b) for c in ("red", "green", "a.b")) for b in first)
    bad = tok.encode("blue")[0]
    assert not state.advance(bad) and "not allowed" in state.error
    state = FsmState(fsm, tok.vocab_size)
    eos = tok.eos_token_ids[0]
    assert not state.advance(eos)  # not yet final
    state = FsmState(fsm, tok.vocab_size)
    for t in _greedy_ids(token_bytes, b"green"):
        assert state.advance(t)
    assert state.done  # nothing may follow a whole choice
    # A done row's mask allows every token (its request has ended; a split launch may still
    # sample one more token for it, which is never committed), as a stopped matcher's does.
    assert len(_allowed(state)) == tok.vocab_size


def _greedy_ids(token_bytes: list[bytes], text: bytes) -> list[int]:
    ids = []
    while text:
        best = max(
            (i for i, b in enumerate(token_bytes) if b and text.startswith(b)), key=lambda i: len(token_bytes[i])
        )
        ids.append(best)
        text = text[len(token_bytes[best]) :]
    return ids


def test_grammars_hand_out_automaton_states_once_built_and_mixed_steps_advance(vocab: tuple[Any, Grammars]) -> None:
    tok, _ = vocab
    grammars = Grammars(tok, tok.vocab_size, filler=MaskFiller("serial"), fsm=True)
    fsm_spec = StructuredOutputs(json=SCHEMAS[4])
    other = StructuredOutputs(regex="[0-9]+")
    first = grammars.state(fsm_spec)
    assert not isinstance(first, FsmState)  # admitted while the automaton builds: llguidance to its end
    assert grammars.fsms is not None and grammars.fsms.wait(fsm_spec, timeout=300) is not None
    states = [grammars.state(fsm_spec), grammars.state(other), first]
    assert isinstance(states[0], FsmState) and not isinstance(states[1], FsmState)
    # The same place, the same mask: where the grammar forces '{"answer": "', llguidance
    # allows only the forced text's own first token, and so does the automaton's state.
    masks = fill_masks(states)
    assert torch.equal(masks[0], masks[2]) and len(_allowed(states[0])) == 1
    forced = _allowed(states[0]).tolist()
    digit = _greedy_ids(tok.token_bytes(), b"7")[0]
    assert advance_all(states, [forced[0], digit, forced[0]]) == [True, True, True]
    masks = fill_masks(states)
    assert torch.equal(masks[0], masks[2])
    assert not states[0].advance(digit) and "not allowed" in states[0].error


def _schemas(depth: int = 2) -> Any:
    """Schemas of aserve.sampling.fsm's subset, nested up to ``depth``."""
    from hypothesis import strategies as st

    def integer(bounds: tuple[int, int]) -> dict[str, Any]:
        return {"type": "integer", "minimum": min(bounds), "maximum": max(bounds)}

    leaves = st.one_of(
        st.tuples(st.integers(-1500, 1500), st.integers(-1500, 1500)).map(integer),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.just({"type": "string"}),
        st.lists(
            st.one_of(st.text("abcé é-", min_size=1, max_size=5), st.integers(-9, 99)),
            min_size=1,
            max_size=4,
            unique=True,
        ).map(lambda v: {"enum": v}),
        st.tuples(st.integers(0, 3), st.integers(0, 5)).map(
            lambda b: {"type": "string", "minLength": b[0], "maxLength": b[0] + b[1]}
        ),
    )
    if depth == 0:
        return leaves

    def array(a: tuple[Any, int, int]) -> dict[str, Any]:
        return {"type": "array", "items": a[0], "minItems": a[1], "maxItems": a[1] + a[2]}

    def obj(props: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}

    inner = _schemas(depth - 1)
    return st.one_of(
        leaves,
        st.tuples(inner, st.integers(0, 2), st.integers(0, 2)).map(array),
        st.dictionaries(st.text("xyz_", min_size=1, max_size=4), inner, min_size=0, max_size=3).map(obj),
    )


@pytest.mark.slow
def test_random_schemas_of_the_subset_walk_to_valid_json_with_llguidances_masks(vocab: tuple[Any, Grammars]) -> None:
    """Hypothesis writes schemas of the subset (nested arrays and closed objects of bounded
    integers, enums, booleans, null and strings); each automaton is built (llguidance allows
    nothing its regex leaves out), random walks through it see llguidance's masks at every
    step, and end in JSON that ``jsonschema`` validates."""
    from hypothesis import HealthCheck, given, settings

    tok, grammars = vocab
    token_bytes = tok.token_bytes()
    eos = set(tok.eos_token_ids)

    def pick(rng: random.Random, step: int, ids: list[int]) -> int:
        # Toward short outputs: an end where allowed, else mostly single-byte tokens, and after
        # a while a closing quote, bracket or brace where one is allowed.
        ends = [t for t in ids if t in eos]
        short = [t for t in ids if len(token_bytes[t]) == 1] or ids
        closing = [t for t in short if token_bytes[t] in (b'"', b"]", b"}")] if step > 40 else []
        return ends[0] if ends else rng.choice(closing or (short if rng.random() < 0.8 else ids))

    @settings(
        max_examples=int(os.environ.get("FSM_EXAMPLES", "12")),
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(_schemas())
    def check(schema: dict[str, Any]) -> None:
        assert schema_regex(schema) is not None, schema
        spec = StructuredOutputs(json=schema)
        fsm = _fsm(tok, grammars, spec)
        assert fsm is not None, schema
        for walk in range(3):
            text = _walk(tok, fsm, _judge(grammars, spec), walk, pick, steps=300)
            jsonschema.validate(json.loads(text), schema)

    check()


def test_an_engine_keeps_a_bounded_number_of_automata(
    vocab: tuple[Any, Grammars], monkeypatch: pytest.MonkeyPatch
) -> None:
    from aserve.sampling import fsm as fsm_mod

    monkeypatch.setattr(fsm_mod, "MAX_AUTOMATA", 2)
    tok, _ = vocab
    grammars = Grammars(tok, tok.vocab_size, filler=MaskFiller("serial"), fsm=True)
    assert grammars.fsms is not None

    def built(spec: StructuredOutputs) -> TokenFSM | None:
        grammars.build_automaton(spec)
        assert grammars.fsms is not None
        return grammars.fsms.wait(spec, timeout=300)

    specs = [StructuredOutputs(choice=(f"x{i}", f"y{i}")) for i in range(3)]
    got = [built(spec) for spec in specs]
    assert all(b is not None for b in got)
    assert grammars.state(specs[2]).fsm is got[2] and grammars.state(specs[1]).fsm is got[1]
    assert grammars.state(specs[0]).fsm is None  # dropped: queued again when asked again
    assert grammars.fsms.wait(specs[0], timeout=300) is not None
    assert grammars.state(specs[2]).fsm is None  # now the least recently asked for
    assert built(StructuredOutputs(regex="a+")) is None  # not an automaton's spec
    assert grammars.fsms.wait(specs[2], timeout=300) is not None  # queued again just above
    vw = StructuredOutputs(choice=("v", "w"))
    assert built(vw) is not None  # specs[2]'s and vw's kept now
    # Specs without an automaton do not push the built ones out.
    for i in range(4):
        assert built(StructuredOutputs(regex=f"b{i}+")) is None
    assert grammars.state(specs[2]).fsm is not None and grammars.state(vw).fsm is not None

    def broken() -> GrammarState:
        raise RuntimeError("no matcher")

    # A judge that fails leaves the spec without an automaton, and nothing waits on it.
    assert grammars.fsms.get(StructuredOutputs(choice=("p", "q")), broken) is None
    assert grammars.fsms.wait(StructuredOutputs(choice=("p", "q"))) is None


def test_the_device_paths_warm_up_moves_a_state_on() -> None:
    """``aserve.device.automata.warm_up`` (run at a CUDA engine's start) on a CPU: token 1
    leads its two-state automaton's state 0 to state 1, through both of a step's ways."""
    from aserve.device.automata import warm_up

    assert warm_up(torch.device("cpu")).tolist() == [1, 0]
    # With a row of logits, the one-launch draw too (here in Triton's interpreter).
    assert warm_up(torch.device("cpu"), torch.zeros(2, 100)).tolist() == [1, 0]

"""Token FSMs for regular structured outputs (``ASERVE_GRAMMAR_FSM=1``, off by default).

A choice, or a JSON schema in the subset :func:`schema_regex` writes as a regular expression,
is compiled once into a token-level automaton by outlines-core (its ``Index``: every state's
allowed tokens and the state each leads to, walked over this model's vocabulary). A request
constrained by one then needs no grammar engine per step: its advance is one lookup and its
mask a copy of its state's row from a table of the automaton's distinct masks. llguidance
computes the same rows each step (~8-14 us a row on this project's VM, and the structured
bench's 256 rows hold 4 distinct masks), which is what a constrained step's host chain waits on
(docs/benchmarks.md, sessions 24-28).

The automaton is an accelerator, never the judge: a request's grammar is still compiled by
llguidance at admission (a bad one is a 400 there), and the automaton is built beside the
engine on a daemon thread (seconds over a 262k vocabulary: outlines-core walks it once a
state). Requests admitted before it is ready keep llguidance to their end.

The language of :func:`schema_regex` lies inside the schema's: objects take their properties
in the schema's order, all required, none other (``additionalProperties: false`` is asked
for); JSON is laid out as llguidance is told to lay it out here (``", "`` and ``": "``, no other
whitespace). Anything outside the subset returns None and stays with llguidance.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from aserve.logs import get_logger
from aserve.sampling.masks import GrammarState, MaskFiller, mask_words
from aserve.sampling_params import StructuredOutputs

if TYPE_CHECKING:
    from aserve.tokenizer.tokenizer import Tokenizer

log = get_logger("aserve.grammar")

# Automata with more states than this are dropped (their masks table would be large, and the
# walk that builds them slow): the grammar stays with llguidance.
MAX_STATES = 20_000

# Automata an engine keeps (a schema's with strings holds ~255k moves a string state).
MAX_AUTOMATA = 64
# The longest bounded string written as an automaton.
MAX_STRING = 64

_META = set("\\.+*?()|[]{}^$#&-~")
# JSON's string characters inside what llguidance allows (walked against it in the tests):
# control characters and DEL only as their escapes; no escaped "/" and no "\u" escapes, some of
# which llguidance refuses.
_JSON_STRING = r'"([^"\\\x00-\x1f\x7f]|\\["\\bfnrt])*"'
_JSON_NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_JSON_INTEGER = r"-?(0|[1-9][0-9]*)"


def escape(text: str) -> str:
    """``text`` as a literal in outlines-core's regex syntax (Rust's ``regex-syntax``)."""
    return "".join("\\" + c if c in _META else c for c in text)


def int_range_regex(lo: int, hi: int) -> str:
    """A regex matching exactly the decimal integers from ``lo`` to ``hi`` as JSON writes them
    (no leading zeros, ``-`` for negatives, no ``-0``)."""
    assert lo <= hi
    alts = []
    if lo < 0:
        alts.append("-" + _nonneg(max(1, -hi), -lo))
    if hi >= 0:
        alts.append(_nonneg(max(lo, 0), hi))
    return "(" + "|".join(alts) + ")"


def _nonneg(lo: int, hi: int) -> str:
    """Integers ``lo`` to ``hi`` (both >= 0), by their number of digits."""
    alts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10**n - 1)
        if a <= b:
            alts.append(_same_length(str(a), str(b)))
    return "(" + "|".join(alts) + ")"


def _same_length(lo: str, hi: str) -> str:
    """Digit strings of one length from ``lo`` to ``hi`` (inclusive)."""
    if not lo:
        return ""
    if lo[0] == hi[0]:
        return lo[0] + _same_length(lo[1:], hi[1:])
    rest = len(lo) - 1
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return f"[{lo[0]}-{hi[0]}]" + "[0-9]" * rest
    alts = [lo[0] + _same_length(lo[1:], "9" * rest)]
    if int(hi[0]) - int(lo[0]) > 1:
        alts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]" + "[0-9]" * rest)
    alts.append(hi[0] + _same_length("0" * rest, hi[1:]))
    return "(" + "|".join(alts) + ")"


def schema_regex(schema: Any) -> str | None:
    """The regex of ``schema``'s JSON texts in this module's subset, or None outside it."""
    if not isinstance(schema, dict):
        return None
    keys = set(schema) - {"title", "description", "$schema"}
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        if keys - {"enum", "const", "type"} or not isinstance(values, list) or not values:
            return None
        if any(isinstance(v, dict | list) for v in values):
            return None
        return "(" + "|".join(escape(json.dumps(v, ensure_ascii=False)) for v in values) + ")"
    kind = schema.get("type")
    if kind == "integer":
        return _integer(schema, keys - {"type"})
    if kind == "boolean" and keys == {"type"}:
        return "(true|false)"
    if kind == "null" and keys == {"type"}:
        return "null"
    if kind == "string" and keys == {"type"}:
        return _JSON_STRING
    if kind == "string" and keys - {"type"} <= {"minLength", "maxLength"}:
        return _bounded_string(schema.get("minLength", 0), schema.get("maxLength"))
    if kind == "number" and keys == {"type"}:
        return _JSON_NUMBER
    if kind == "array":
        return _array(schema, keys - {"type"})
    if kind == "object":
        return _object(schema, keys - {"type"})
    return None


def _bounded_string(least: Any, most: Any) -> str | None:
    """A string of ``least`` to ``most`` characters (at most :data:`MAX_STRING`: each is a
    state whose moves span the vocabulary)."""
    if not isinstance(least, int) or not isinstance(most, int) or not 0 <= least <= most <= MAX_STRING:
        return None
    return rf'"([^"\\\x00-\x1f\x7f]|\\["\\bfnrt]){{{least},{most}}}"'


def _integer(schema: dict[str, Any], keys: set[str]) -> str | None:
    if not keys:
        return _JSON_INTEGER
    if keys != {"minimum", "maximum"}:
        return None
    lo, hi = schema["minimum"], schema["maximum"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or lo > hi:
        return None
    return int_range_regex(lo, hi)


def _array(schema: dict[str, Any], keys: set[str]) -> str | None:
    if keys - {"items", "minItems", "maxItems"} or "items" not in schema:
        return None
    item = schema_regex(schema["items"])
    least, most = schema.get("minItems", 0), schema.get("maxItems")
    if item is None or not isinstance(least, int) or not (most is None or isinstance(most, int)):
        return None
    if most is not None and most < least:
        return None
    if most == 0:
        return r"\[\]"
    upper = "" if most is None else str(most - 1)
    if least == 0:
        return rf"\[({item}(, {item}){{0,{upper}}})?\]"
    return rf"\[{item}(, {item}){{{least - 1},{upper}}}\]"


def _object(schema: dict[str, Any], keys: set[str]) -> str | None:
    props = schema.get("properties", {})
    if keys - {"properties", "required", "additionalProperties"} or schema.get("additionalProperties") is not False:
        return None
    if not isinstance(props, dict) or sorted(schema.get("required", [])) != sorted(props):
        return None
    fields = []
    for name, sub in props.items():
        value = schema_regex(sub)
        if value is None:
            return None
        fields.append(escape(json.dumps(name, ensure_ascii=False)) + ": " + value)
    return r"\{" + ", ".join(fields) + r"\}"


def spec_regex(spec: StructuredOutputs) -> str | None:
    """The regex of a spec this module can compile (a choice, a JSON schema in the subset)."""
    if spec.choice is not None:
        return "(" + "|".join(escape(c) for c in spec.choice) + ")"
    if spec.json is not None:
        try:
            return schema_regex(json.loads(str(spec.json)) if isinstance(spec.json, str) else spec.json)
        except ValueError:
            return None
    return None


class TokenFSM:
    """A regex's automaton over a vocabulary: outlines-core's ``Index`` for the next state, and
    ``masks`` ([distinct rows, words] int32, host) with ``rows[state]`` each state's row in it.

    A state's mask allows the tokens the index allows, and every end-of-sequence token where
    the state is final. ``stops`` holds the final states that allow nothing else (the output is
    complete: the request ends, as a stopped llguidance matcher ends it)."""

    def __init__(self, index: Any, vocab_size: int, eos: Sequence[int], index_eos: int) -> None:
        self.index = index
        self.initial = int(index.get_initial_state())
        self.eos = frozenset(eos)
        words = mask_words(vocab_size)
        table: dict[bytes, int] = {}
        self.rows: dict[int, int] = {}
        self.stops: set[int] = set()
        self.finals = set(index.get_final_states())
        rows: list[torch.Tensor] = []
        for state, moves in index.get_transitions().items():
            ids = [t for t in moves if t != index_eos]
            bits = torch.zeros(words * 32, dtype=torch.bool)
            bits[ids] = True
            if state in self.finals:
                bits[list(self.eos)] = True
                if not ids:
                    self.stops.add(state)
            packed = _pack(bits)
            self.rows[state] = row = table.setdefault(packed.numpy().tobytes(), len(table))
            if row == len(rows):
                rows.append(packed)
        for state in self.finals - set(self.rows):  # a final state with no move out
            self.stops.add(state)
        self.masks = torch.stack(rows) if rows else torch.zeros((0, words), dtype=torch.int32)
        self.row_bytes = words * 4
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def row_of(self, state: FsmState) -> int:
        """``state``'s row of :meth:`device_masks`: an ended request's (done or failed) is the
        all-ones row after the automaton's own, as a stopped matcher's mask allows every token."""
        return len(self.masks) if state.done or state.error else self.rows[state.state]

    def device_masks(self, device: torch.device) -> torch.Tensor:
        """``masks`` and an all-ones row after them, on ``device`` (copied once, then kept)."""
        table = self._on_device.get(device)
        if table is None:
            ones = torch.full((1, self.masks.shape[1]), -1, dtype=torch.int32)
            table = self._on_device[device] = torch.cat([self.masks, ones]).to(device)
        return table

    def next_state(self, state: int, token: int) -> int | None:
        """The state after ``token``, or None where the automaton does not allow it."""
        nxt = self.index.get_next_state(state, token)
        return None if nxt is None else int(nxt)

    def mask_ptr(self, state: int) -> int:
        """The address of ``state``'s mask row (``masks`` is contiguous and kept)."""
        return int(self.masks.data_ptr()) + self.rows[state] * self.row_bytes


def _pack(bits: torch.Tensor) -> torch.Tensor:
    """[words * 32] bools -> [words] int32, bit ``t % 32`` of word ``t // 32`` for token t."""
    weights = torch.tensor([1 << i for i in range(32)], dtype=torch.int64)
    return (bits.view(-1, 32).to(torch.int64) * weights).sum(1).to(torch.int32)


def build_fsm(regex: str, token_bytes: Sequence[bytes], special: Sequence[int], eos: Sequence[int], vocab_size: int) -> TokenFSM | None:  # fmt: skip
    """``regex``'s automaton over the vocabulary (special and end-of-sequence tokens are never
    the regex's: the latter are allowed in final states), or None if outlines-core cannot
    build it or it is larger than :data:`MAX_STATES`."""
    from outlines_core import Index, Vocabulary

    skip = set(special) | set(eos)
    by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(token_bytes):
        if b and i not in skip:
            by_bytes.setdefault(b, []).append(i)
    index_eos = eos[0] if eos else 0
    try:
        index = Index(regex, Vocabulary(index_eos, by_bytes))
    except Exception as exc:  # outside outlines-core's syntax or too large for it
        log.info("grammar_fsm_unbuilt", error=repr(exc))
        return None
    if len(index.get_transitions()) > MAX_STATES:
        log.info("grammar_fsm_too_large", states=len(index.get_transitions()))
        return None
    return TokenFSM(index, vocab_size, eos, index_eos)


class FsmState(GrammarState):
    """One constrained request's place in a :class:`TokenFSM`: what a :class:`GrammarState`
    is to its commit and fill (``done``, ``error``, :meth:`advance`), with no matcher."""

    __slots__ = ("state",)

    def __init__(self, fsm: TokenFSM, vocab_size: int, filler: MaskFiller | None = None) -> None:
        self.fsm = fsm
        self.matcher = None
        self.vocab_size = vocab_size
        self.cache = None
        self.key = None
        self.token_table = None
        self.shard = 0
        self.filler = filler
        self.prefix = None
        self.state = fsm.initial
        self.done = fsm.initial in fsm.stops
        self.error = ""

    def advance(self, token: int) -> bool:
        fsm = self.fsm
        assert fsm is not None
        if token in fsm.eos:
            ok = self.state in fsm.finals
            self.done = ok
        else:
            nxt = fsm.next_state(self.state, token)
            ok = nxt is not None
            if nxt is not None:
                self.state = nxt
                self.done = nxt in fsm.stops
        self.error = "" if ok else f"token {token} is not allowed here"
        return ok


class FsmBuilds:
    """A :class:`Grammars`' automata by spec key: built one at a time on a daemon thread (a
    build walks the vocabulary once a state on one core) from a key's first request; None while
    waiting or building, or where the spec has none. At most :data:`MAX_AUTOMATA` keys are
    kept, the least recently asked for dropped first (requests keep the automaton they hold)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._vocab: tuple[list[bytes], list[int], list[int]] | None = None  # bytes, special, eos: at the first build
        self._fsms: OrderedDict[tuple[str, str], TokenFSM | None] = OrderedDict()
        self._done: dict[tuple[str, str], threading.Event] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[tuple[str, str], str, threading.Event]] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def get(self, spec: StructuredOutputs) -> TokenFSM | None:
        """The spec's automaton if built; else None (its build is queued at the first call)."""
        key = spec.key
        with self._lock:
            if key in self._fsms:
                self._fsms.move_to_end(key)
                return self._fsms[key]
            if key in self._done:  # queued or building
                return None
            regex = spec_regex(spec)
            self._done[key] = done = threading.Event()
            if regex is None:
                self._keep(key, None)
                done.set()
                return None
            self._queue.put((key, regex, done))
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True, name="aserve-fsm")
                self._worker.start()
        return None

    def wait(self, spec: StructuredOutputs, timeout: float | None = None) -> TokenFSM | None:
        """The spec's automaton once its build ends (queued if need be; None if it has none)."""
        self.get(spec)
        with self._lock:
            done = self._done.get(spec.key)
        if done is not None:
            done.wait(timeout)
        with self._lock:
            return self._fsms.get(spec.key)

    def _keep(self, key: tuple[str, str], fsm: TokenFSM | None) -> None:
        """Under the lock: ``key``'s result kept, the oldest dropped past :data:`MAX_AUTOMATA`."""
        self._fsms[key] = fsm
        while len(self._fsms) > MAX_AUTOMATA:
            old, _ = self._fsms.popitem(last=False)
            del self._done[old]

    def _vocabulary(self) -> tuple[list[bytes], list[int], list[int]]:
        if self._vocab is None:  # only the worker thread builds
            tok = self._tokenizer
            special = [i for i in range(tok.vocab_size) if tok.is_special(i)]
            self._vocab = (tok.token_bytes(), special, list(tok.eos_token_ids))
        return self._vocab

    def _work(self) -> None:
        while True:
            key, regex, done = self._queue.get()
            t0 = time.perf_counter()
            try:
                fsm = build_fsm(regex, *self._vocabulary(), vocab_size=self._vocab_size)
            except Exception as exc:  # kept with llguidance
                log.warning("grammar_fsm_failed", error=repr(exc))
                fsm = None
            with self._lock:
                self._keep(key, fsm)
            done.set()
            log.info(
                "grammar_fsm_built",
                seconds=round(time.perf_counter() - t0, 3),
                states=None if fsm is None else len(fsm.rows),
                masks=None if fsm is None else len(fsm.masks),
            )

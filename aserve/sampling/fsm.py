"""Token automata for regular structured outputs: on by default on a GPU (:func:`automata_on`;
``ASERVE_GRAMMAR_FSM=1`` or ``0`` to choose).

A choice, or a JSON schema in the subset :mod:`aserve.sampling.schema_regex` writes as a regex,
is compiled once into a token-level automaton by outlines-core (its ``Index``: every state's
allowed tokens and the state each leads to, walked over this model's vocabulary). A request
constrained by one then needs no grammar engine per step: its advance is one lookup and its
mask a copy of its state's row from a table of the automaton's distinct masks. llguidance
computes the same rows each step (~8-14 us a row on this project's VM, and the structured
bench's 256 rows hold 4 distinct masks), which is what a constrained step's host chain waits on
(docs/benchmarks.md, sessions 24-29).

llguidance stays the judge. It compiles every request's grammar at admission (a bad one is a
400 there), and the masks in an automaton's table are its own: the build walks the automaton
with llguidance's matcher beside it and keeps, for each state, the mask llguidance computed
there; an automaton where llguidance allows a token it has no move for is not used
(:class:`TokenFSM`). So a request gives the same tokens with or without its automaton. The
build runs beside the engine on a daemon thread (seconds over a 262k vocabulary: outlines-core
walks it once a state); requests admitted before it is ready keep llguidance to their end.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from aserve.logs import get_logger
from aserve.sampling.masks import GrammarState, MaskFiller, mask_words
from aserve.sampling.schema_regex import spec_regex
from aserve.sampling_params import StructuredOutputs

if TYPE_CHECKING:
    from aserve.tokenizer.tokenizer import Tokenizer

log = get_logger("aserve.grammar")

# Automata with more states than this are dropped (their masks table would be large, and the
# walk that builds them slow): the grammar stays with llguidance.
MAX_STATES = 20_000

# Automata an engine keeps, builds that may wait, and spec keys remembered to have none.
MAX_AUTOMATA = 64
MAX_QUEUED = 8
MAX_WITHOUT = 1024


def automata_on(device_type: str) -> bool:
    """Whether an engine on ``device_type`` builds token automata: ``ASERVE_GRAMMAR_FSM`` (1 or
    0) where set; else on a GPU, where a constrained step's host work paces the device (issue
    16's figures, docs/benchmarks.md), and not on a CPU, where the build's core is better spent
    on the forward; never without outlines-core."""
    env = os.environ.get("ASERVE_GRAMMAR_FSM")
    wanted = env == "1" if env in ("0", "1") else device_type == "cuda"
    return wanted and importlib.util.find_spec("outlines_core") is not None


class TokenFSM:
    """A regex's automaton over a vocabulary whose masks are llguidance's: outlines-core's
    ``Index`` names where a request is (its state) and where each token leads; ``masks``
    ([distinct rows, words] int32, host) holds, at ``rows[state]``, the mask llguidance computed
    there for the same grammar, once, while the automaton was built.

    Built by walking the automaton from its start with llguidance's matcher (``judge``) beside
    it: each state is reached once, by a token llguidance allows, and the matcher there gives
    the state's mask. A state llguidance allows more in than the automaton has moves for (the
    regex leaves something out) makes the whole automaton :class:`Unequal`. So a request's
    masks are the ones llguidance would have given it, token for token; the automaton saves
    computing them again (on the walk's premise, checked by the tests' walks: llguidance's mask
    is a function of the automaton's state, not of the path to it).

    ``stops`` holds the states where llguidance's matcher stopped (nothing may follow)."""

    def __init__(self, index: Any, vocab_size: int, eos: Sequence[int], index_eos: int, judge: GrammarState) -> None:
        """Only the moves llguidance allows are kept, and those compactly (a state's most common
        destination, then the exceptions): a string's state has a move for nearly every token,
        almost all back to itself, and outlines-core's index holds each (it is not kept). The
        index is read a state at a time (``index.get_transitions()`` holds the GIL for the
        whole table: ~0.6 s for a small object schema, during which the event loop waits)."""
        self.initial = int(index.get_initial_state())
        self.eos = frozenset(eos)
        words = mask_words(vocab_size)
        table: dict[bytes, int] = {}
        rows: list[np.ndarray] = []
        self.rows: dict[int, int] = {}
        self.stops: set[int] = set()
        self._default: dict[int, int] = {}  # a state's most common destination
        self._moves: dict[int, dict[int, int]] = {}  # its allowed tokens going elsewhere
        todo = [(self.initial, judge.matcher)]
        reached = {self.initial}
        while todo:
            state, matcher = todo.pop()
            theirs = np.frombuffer(matcher.compute_bitmask(), dtype=np.int32)[:words]
            ids = np.asarray(index.get_allowed_tokens(state), dtype=np.int64)
            ids = ids[ids != index_eos]
            ours = np.zeros(words * 32, dtype=bool)
            ours[ids] = True
            if index.is_final_state(state):
                ours[list(self.eos)] = True
            extra = theirs & ~_pack(ours)
            if extra.any():
                raise Unequal(state, _first_bit(extra))
            self.rows[state] = row = table.setdefault(theirs.tobytes(), len(table))
            if row == len(rows):
                rows.append(theirs.copy())
            if matcher.is_stopped():
                self.stops.add(state)
                continue
            ids = ids[(theirs[ids >> 5] >> (ids & 31)) & 1 == 1]
            if not len(ids):
                continue
            dest = np.fromiter((index.get_next_state(state, t) for t in ids.tolist()), dtype=np.int64, count=len(ids))
            targets, first, counts = np.unique(dest, return_index=True, return_counts=True)
            self._default[state] = common = int(targets[counts.argmax()])
            odd = dest != common
            self._moves[state] = dict(zip(ids[odd].tolist(), dest[odd].tolist(), strict=True))
            # One token llguidance allows into each state not yet reached.
            for nxt, token in zip(targets.tolist(), ids[first].tolist(), strict=True):
                if nxt not in reached:
                    if len(reached) >= MAX_STATES:
                        raise TooLarge(len(reached))
                    reached.add(nxt)
                    after = matcher.deep_copy()
                    if not after.consume_token(token):
                        raise Unequal(state, token)
                    todo.append((nxt, after))
        self.masks = torch.from_numpy(np.stack(rows))
        # Each state's mask as bytes (bit t % 8 of byte t // 8 on little-endian rows): an
        # advance (FsmState.advance) reads one byte instead of indexing the array.
        by_row = [row.tobytes() for row in rows]
        self._bytes = {state: by_row[row] for state, row in self.rows.items()}
        self.row_bytes = words * 4
        self.numbers = {state: i for i, state in enumerate(self.rows)}  # its number on the device
        self._tables: dict[torch.device, DeviceAutomaton] = {}
        # Its tables built here, on the build's thread: a step's launch only copies them.
        self._tables[torch.device("cpu")] = DeviceAutomaton.build(self)

    def row_of(self, state: FsmState) -> int:
        """``state``'s row of its masks on a device (``on_device(device).masks``): an ended
        request's (done or failed) is the all-ones row after the automaton's own, as a stopped
        matcher's mask allows every token."""
        return len(self.masks) if state.done or state.error else self.rows[state.state]

    def on_device(self, device: torch.device) -> DeviceAutomaton:
        """The automaton itself on ``device`` (built once, then kept): its states renumbered
        0..N-1 in the order they were reached, N for an ended request."""
        tables = self._tables.get(device)
        if tables is None:
            host = self._tables[torch.device("cpu")]
            tables = self._tables[device] = host._replace(
                masks=host.masks.to(device),
                mask_of=host.mask_of.to(device),
                keys=host.keys.to(device),
                after=host.after.to(device),
            )
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # once an automaton: the copies are done before any stream reads them
        return tables

    def number_of(self, state: FsmState) -> int:
        """``state``'s number on the device (:meth:`on_device`)."""
        return len(self.numbers) if state.done or state.error else self.numbers[state.state]

    def mask_ptr(self, state: int) -> int:
        """The address of ``state``'s mask row (``masks`` is contiguous and kept)."""
        return int(self.masks.data_ptr()) + self.rows[state] * self.row_bytes


class DeviceAutomaton(NamedTuple):
    """A :class:`TokenFSM` on a device, for a step whose rows' states stay there
    (:mod:`aserve.device.automata`): state ``s`` (numbered as ``TokenFSM.numbers``) has the
    mask ``masks[mask_of[s]]``, and token ``t`` leads it to ``after[k]``, ``k`` the number of
    ``keys`` at most ``s * stride + t``. The keys, ascending: each state's first token (to its
    most common destination), each of its other moves (the exceptions and its end-of-sequence
    tokens), and the token after each such move (back to the most common destination), so
    that the last key at most a query is the query's own move. An end-of-sequence token leads
    to ``done``, the last state, whose mask (like a stop state's) allows every token
    (:meth:`TokenFSM.row_of`). Only tokens a state's mask allows are ever looked up (a masked
    draw). Three device operations a lookup, none of them a sync."""

    masks: torch.Tensor  # [distinct masks + 1, words] int32: TokenFSM.masks and an all-ones row
    mask_of: torch.Tensor  # [N + 1] int64
    keys: torch.Tensor  # [M] int64, ascending
    after: torch.Tensor  # [M + 1] int64: after[k] = the destination of keys[k - 1]
    stride: int
    done: int

    @classmethod
    def build(cls, fsm: TokenFSM) -> DeviceAutomaton:
        """On the host (:meth:`TokenFSM.on_device` copies it to a device)."""
        numbers, ones = fsm.numbers, len(fsm.masks)
        done = len(numbers)
        stride = fsm.masks.shape[1] * 32
        mask_of = [ones if s in fsm.stops else fsm.rows[s] for s in numbers] + [ones]
        to: dict[int, int] = {done * stride: done}
        for s, i in numbers.items():
            common = numbers[fsm._default[s]] if s in fsm._default else i
            moves = {t: numbers[d] for t, d in fsm._moves.get(s, {}).items()}
            if s not in fsm.stops:
                moves.update(dict.fromkeys(fsm.eos, done))
            base = i * stride
            to[base] = common
            for t in moves:
                if t + 1 < stride:
                    to[base + t + 1] = common
            for t, d in moves.items():  # a move's own key over the one after its neighbour
                to[base + t] = d
        keys = sorted(to)

        def put(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        masks = torch.cat([fsm.masks, torch.full((1, fsm.masks.shape[1]), -1, dtype=torch.int32)])
        return cls(masks, put(mask_of), put(keys), put([done] + [to[k] for k in keys]), stride, done)

    def masks_of(self, states: torch.Tensor) -> torch.Tensor:
        """[R] states -> their masks [R, words]."""
        return self.masks.index_select(0, self.mask_of.index_select(0, states))

    def step(self, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[R] states and the tokens drawn there -> the states they lead to."""
        query = torch.add(tokens, states, alpha=self.stride)
        return self.after.index_select(0, torch.searchsorted(self.keys, query, right=True))


class Unequal(Exception):
    """llguidance allows ``token`` in the automaton's ``state`` where the automaton has no move
    for it: the regex's language is not the grammar's there, and the automaton is not used."""

    def __init__(self, state: int, token: int) -> None:
        super().__init__(f"llguidance allows token {token} in state {state}, the automaton does not")
        self.state, self.token = state, token


class TooLarge(Exception):
    """The automaton reaches more than :data:`MAX_STATES` states."""


def _first_bit(words: np.ndarray) -> int:
    word = int(np.flatnonzero(words)[0])
    return word * 32 + (int(words[word]) & -int(words[word])).bit_length() - 1


def _pack(bits: np.ndarray) -> np.ndarray:
    """[words * 32] bools -> [words] int32, bit ``t % 32`` of word ``t // 32`` for token t."""
    return np.packbits(bits.reshape(-1, 32), axis=1, bitorder="little").view("<i4").ravel()


def build_fsm(regex: str, token_bytes: Sequence[bytes], special: Sequence[int], eos: Sequence[int], vocab_size: int, judge: GrammarState) -> TokenFSM | None:  # fmt: skip
    """``regex``'s automaton over the vocabulary with the masks of ``judge`` (llguidance's
    state at the start of the same grammar, its C tokenizer table kept alive in it; special and end-of-sequence tokens are never
    the regex's), or None if outlines-core cannot build it, it has more than
    :data:`MAX_STATES` states, or llguidance allows more than it somewhere (:class:`Unequal`)."""
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
    try:
        return TokenFSM(index, vocab_size, eos, index_eos, judge)
    except Unequal as exc:
        log.info("grammar_fsm_unequal", error=str(exc), token=bytes(token_bytes[exc.token])[:32])
    except TooLarge as exc:
        log.info("grammar_fsm_too_large", states=exc.args[0])
    return None


class FsmState(GrammarState):
    """One constrained request's place in a :class:`TokenFSM`: what a :class:`GrammarState`
    is to its commit and fill (``done``, ``error``, :meth:`advance`), with no matcher."""

    __slots__ = ("on_device", "state")

    def __init__(self, fsm: TokenFSM, vocab_size: int, filler: MaskFiller | None = None) -> None:
        super().__init__(None, vocab_size, filler=filler)
        self.fsm = fsm
        self.state = fsm.initial
        self.done = fsm.initial in fsm.stops
        # (FutureMap row, generation) whose automaton state on the device the last step that
        # drew this request's token left there (aserve.device.automata); None: none did.
        self.on_device: tuple[int | None, int] | None = None

    def advance(self, token: int) -> bool:
        # Per row of every constrained step's commit, so inline: the state's mask allows the
        # token (its byte), then its destination (the state's exceptions, else its default).
        fsm: TokenFSM = self.fsm
        state = self.state
        if not fsm._bytes[state][token >> 3] >> (token & 7) & 1:
            self.error = f"token {token} is not allowed here"
            return False
        if token in fsm.eos:
            self.done = True
        else:
            self.state = state = fsm._moves[state].get(token, fsm._default[state])
            self.done = state in fsm.stops
        self.error = ""
        return True


class FsmBuilds:
    """A :class:`Grammars`' automata by spec key: built one at a time on a daemon thread (a
    build walks the vocabulary once a state on one core) from a key's first request; None while
    queued or building, or where the spec has none. At most :data:`MAX_AUTOMATA` automata are
    kept, the least recently asked for dropped first (requests keep the automaton they hold);
    at most :data:`MAX_QUEUED` builds wait (a spec asked for beyond them is asked again by its
    next request); the keys without one are remembered apart (:data:`MAX_WITHOUT`)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._vocab: tuple[list[bytes], list[int], list[int]] | None = None  # bytes, special, eos: at the first build
        self._fsms: OrderedDict[tuple[str, str], TokenFSM] = OrderedDict()
        self._without: OrderedDict[tuple[str, str], None] = OrderedDict()  # outside the subset, unbuilt or refused
        self._pending: dict[tuple[str, str], threading.Event] = {}  # queued or building
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[tuple[str, str], str, GrammarState]] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def get(self, spec: StructuredOutputs, judge: Callable[[], GrammarState]) -> TokenFSM | None:
        """The spec's automaton if built; else None (its build is queued at the first call,
        with the llguidance state ``judge`` returns: see :class:`TokenFSM`)."""
        key = spec.key
        with self._lock:
            if key in self._fsms:
                self._fsms.move_to_end(key)
                return self._fsms[key]
            if key in self._without or key in self._pending or len(self._pending) >= MAX_QUEUED:
                return None
            regex = spec_regex(spec)
            if regex is None:
                self._none(key)
                return None
            try:
                state = judge()
            except Exception as exc:  # the request itself meets this error at admission
                log.warning("grammar_fsm_failed", error=repr(exc))
                self._none(key)
                return None
            self._pending[key] = threading.Event()
            self._queue.put((key, regex, state))
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True, name="aserve-fsm")
                self._worker.start()
        return None

    def wait(self, spec: StructuredOutputs, timeout: float | None = None) -> TokenFSM | None:
        """The spec's automaton once its build ends (None if it has none or was not queued:
        see :meth:`get`)."""
        with self._lock:
            pending = self._pending.get(spec.key)
        if pending is not None:
            pending.wait(timeout)
        with self._lock:
            return self._fsms.get(spec.key)

    def _none(self, key: tuple[str, str]) -> None:
        """Under the lock: ``key`` has no automaton (the oldest forgotten past :data:`MAX_WITHOUT`)."""
        self._without[key] = None
        while len(self._without) > MAX_WITHOUT:
            self._without.popitem(last=False)

    def _vocabulary(self) -> tuple[list[bytes], list[int], list[int]]:
        if self._vocab is None:  # only the worker thread builds
            tok = self._tokenizer
            special = [i for i in range(tok.vocab_size) if tok.is_special(i)]
            self._vocab = (tok.token_bytes(), special, list(tok.eos_token_ids))
        return self._vocab

    def _work(self) -> None:
        while True:
            key, regex, judge = self._queue.get()
            t0 = time.perf_counter()
            try:
                fsm = build_fsm(regex, *self._vocabulary(), vocab_size=self._vocab_size, judge=judge)
            except Exception as exc:  # kept with llguidance
                log.warning("grammar_fsm_failed", error=repr(exc))
                fsm = None
            del judge
            with self._lock:
                if fsm is None:
                    self._none(key)
                else:
                    self._fsms[key] = fsm
                    while len(self._fsms) > MAX_AUTOMATA:
                        self._fsms.popitem(last=False)
                self._pending.pop(key).set()
            log.info(
                "grammar_fsm_built",
                seconds=round(time.perf_counter() - t0, 3),
                states=None if fsm is None else len(fsm.rows),
                masks=None if fsm is None else len(fsm.masks),
            )

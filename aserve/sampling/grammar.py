"""Structured outputs: llguidance matchers, their token masks, and a cache of compiled grammars.

One :class:`Grammars` per engine. Its llguidance tokenizer (every token's bytes: ~1.3 s for
the default model's 262k vocabulary on one core) is built at the first structured request
(most engines never see one) and is what each request's ``LLMatcher`` walks. Where the
pieces run, and how a constrained step splits its launch under the overlap scheduler, is in
``docs/architecture.md`` ("Structured outputs").

* admission: :meth:`Grammars.matcher` compiles the request's grammar (cached by its key, so
  the next request with the same schema gets a copy of a ready matcher) or raises a typed 400;
* launch (host): :func:`fill_masks` writes each constrained row's allowed-token bitmask; a
  step launched while earlier ones are in flight fills them after those commits, while the
  device runs its forward (the split launch);
* sampling (device): the sampler sends masked-out logits to -inf (aserve/kernels/bitmask.py on CUDA);
* commit: the sampled token advances the matcher (``consume_token``); a matcher that is
  stopped (the language allows nothing more) ends the request with ``"stop"``.

Why llguidance and not xgrammar: it needs no ``transformers`` at run time (xgrammar builds
its tokenizer info from a transformers tokenizer), takes any vocabulary as a list of token
bytes, builds a matcher in ~1 ms and a 262k-token mask in 5-40 us on one core (measured here
with the default model and a JSON schema; both are vLLM's backends, and llama.cpp's is llguidance).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from aserve.errors import InvalidRequestError
from aserve.logs import get_logger
from aserve.sampling_params import StructuredOutputs

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

    from aserve.tokenizer.tokenizer import Tokenizer

log = get_logger("aserve.grammar")

# Compiled grammars kept (a pristine matcher each; requests get deep copies).
_CACHE_SIZE = 256
# A JSON object of any shape (OpenAI's response_format json_object).
_ANY_OBJECT_SCHEMA = json.dumps({"type": "object"})
# JSON is written as json.dumps writes it: ", " and ": " and no other whitespace. With the
# grammar's default (any run of whitespace between tokens) the default model, sampled, filled
# outputs with tabs and newlines until max_tokens in 1 of ~30 requests. A schema may still
# ask for another layout in its own "x-guidance" object (llguidance's JSON options).
_JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def mask_words(vocab_size: int) -> int:
    """int32 words in one row's bitmask (bit ``t % 32`` of word ``t // 32`` allows token t)."""
    return (vocab_size + 31) // 32


class Grammars:
    """The engine's grammar compiler: an llguidance tokenizer and compiled-grammar cache."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        native_tokens: bool | None = None,
        filler: MaskFiller | None = None,
    ) -> None:
        """``native_tokens``: give llguidance the C tokenizer table when the extension is built
        (None: unless ``ASERVE_GRAMMAR_TOKENS=python``; False: always the Python callback).
        ``filler``: how the requests' masks are filled (:data:`MASK_FILLER` unless given; an
        engine passes :meth:`MaskFiller.for_device`)."""
        self.vocab_size = vocab_size
        self.filler = MASK_FILLER if filler is None else filler
        if native_tokens is None:
            native_tokens = os.environ.get("ASERVE_GRAMMAR_TOKENS", "") != "python"
        self.native_tokens = native_tokens
        self.token_table: Any = None  # the C table's capsule, when llguidance calls it
        self._tokenizer = tokenizer
        self._ll_tokenizer: Any = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], _Compiled] = OrderedDict()  # compiled grammars by key
        self.masks = MaskCache()  # this vocabulary's masks by grammar and committed prefix

    def _build(self) -> None:
        t0 = time.perf_counter()
        try:
            import llguidance

            tok = self._tokenizer
            token_bytes = tok.token_bytes()
            greedy = _GreedyTokenizer(token_bytes)

            # llguidance tokenizes the bytes a grammar forces (a separator after a number, a
            # closing bracket) while it computes masks: on the H200 host over half the rows of
            # a JSON-schema step called back here (~16 us each, under the GIL). The strings are
            # few and repeat, so each is encoded once. They are fragments from the middle of an
            # output: a tokenizer that prepends its dummy-prefix space (sentencepiece's llama
            # vocabularies: "-" -> "▁", "-") would force a token the grammar then rejects, so
            # ids whose bytes are not exactly the fragment's are replaced by a greedy match.
            @functools.lru_cache(maxsize=4096)
            def _encode(text: bytes) -> tuple[int, ...]:
                ids = tok.encode(text.decode("utf-8", errors="replace"))
                if b"".join(token_bytes[i] for i in ids) == text:
                    return tuple(ids)
                return greedy(text)

            special = [i for i in range(tok.vocab_size) if tok.is_special(i)]
            eos = list(tok.eos_token_ids)
            native = _native_tokens() if self.native_tokens else None
            if native is not None:
                try:
                    self._ll_tokenizer = self._c_form(native, llguidance, token_bytes, special, eos, _encode)
                except Exception as exc:  # the Python form below still works
                    log.warning("grammar_c_tokenizer_failed", error=repr(exc))
                    self.token_table = None
            if self._ll_tokenizer is None:

                class _Vocab:  # what llguidance.TokenizerWrapper reads
                    eos_token_id = eos[0] if eos else 0
                    bos_token_id = tok.bos_token_id
                    tokens = token_bytes
                    special_token_ids = special

                    def __call__(self, text: bytes) -> list[int]:
                        return list(_encode(text))

                self._ll_tokenizer = llguidance.LLTokenizer(
                    llguidance.TokenizerWrapper(_Vocab()), n_vocab=self.vocab_size, eos_token=eos
                )
        except Exception as exc:  # reported to every request that needs it
            self._error = exc
        log.info(
            "grammar_tokenizer_built",
            seconds=round(time.perf_counter() - t0, 3),
            native=self.token_table is not None,
            error=self._error,
        )

    def _c_form(self, native: Any, llguidance: Any, token_bytes: list[bytes], special: list[int], eos: list[int],
                encode: Callable[[bytes], tuple[int, ...]]) -> Any:  # fmt: skip
        """llguidance's tokenizer calling the C table (aserve/sampling/_grammar_tokens.c),
        which answers without the GIL once a fragment is known, so a step's masks can be
        computed on several threads. llguidance takes it through its llama.cpp form, which
        reads the vocabulary as given: marked as its Python form marks it (special tokens
        prefixed with 0xFF, the first end-of-sequence token empty, padded to the model's
        vocabulary), so both forms compute the same masks (tested)."""
        specials = set(special)
        marked = [b"\xff" + b if i in specials and not b.startswith(b"\xff") else b for i, b in enumerate(token_bytes)]
        marked[eos[0] if eos else 0] = b""
        marked += [b""] * (self.vocab_size - len(marked))
        self.token_table = native.new(encode, 4096)
        return llguidance.LLTokenizer.from_llamacpp(
            tokens=marked,
            vocab_ptr=native.address(self.token_table),
            tokenize_fptr=native.tokenize_fptr(),
            eos_token=eos or [0],
        )

    def _ll(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None and self._error is None:
                self._build()
        if self._error is not None:
            raise InvalidRequestError(
                f"structured outputs are unavailable: {self._error}", param="structured_outputs"
            ) from self._error
        return self._ll_tokenizer

    def state(self, spec: StructuredOutputs, filler: MaskFiller | None = None, cached: bool = True) -> GrammarState:
        """A fresh request's state for ``spec``, or :class:`InvalidRequestError`, whose masks
        ``filler`` fills (this compiler's own unless given) and, unless ``cached`` is False,
        the mask cache answers when it can. A grammar's requests take its templates in turn
        (:meth:`_matcher`), one per thread of the filler.

        Matchers leave this class only inside a state, which keeps the C tokenizer table they
        call alive (llguidance holds only its address)."""
        filler = self.filler if filler is None else filler
        compiled = self._compiled(spec)
        shards = filler.threads if filler.kind == "executor" and self.token_table is not None else 1
        shard = compiled.turn % shards
        compiled.turn += 1
        matcher = self._matcher(compiled, shard)
        cache, key = (self.masks, spec.key) if cached else (None, None)
        return GrammarState(matcher, self.vocab_size, cache, key, self.token_table, shard, filler)

    def _matcher(self, compiled: _Compiled, shard: int) -> Any:
        """A fresh ``llguidance.LLMatcher``: a copy of ``compiled``'s template number ``shard``.

        Copies of one compiled matcher share its lexer behind one lock (llguidance's parser
        keeps it in an ``Arc<Mutex<..>>`` that ``deep_copy`` shares), so their masks cannot be
        computed at the same time: on this project's 2-core VM two Python threads filling
        copies of one template ran 1.9x slower than one thread, and llguidance's pool of two on
        copies of two templates (rows grouped by template) 1.8x faster than one thread
        (docs/benchmarks.md, "Issue 16: the lock behind the mask fill"). A grammar
        therefore has up to one template per fill thread, each compiled on first use."""
        import llguidance

        while len(compiled.templates) <= shard:
            compiled.templates.append(llguidance.LLMatcher(self._ll(), compiled.grammar, log_level=0))
        return compiled.templates[shard].deep_copy()

    def _compiled(self, spec: StructuredOutputs) -> _Compiled:
        import llguidance

        key = spec.key
        compiled = self._cache.get(key)
        if compiled is None:
            grammar = _grammar_text(spec)
            first = llguidance.LLMatcher(self._ll(), grammar, log_level=0)
            if first.is_error():
                raise InvalidRequestError(
                    f"structured_outputs: cannot compile the {key[0]}: {first.get_error()}",
                    param="structured_outputs",
                )
            compiled = self._cache[key] = _Compiled(grammar, [first])
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return compiled


@dataclass
class _Compiled:
    """A grammar's text, its templates (pristine matchers; requests get deep copies) and the
    number of requests that took one (the next takes ``templates[turn % threads]``)."""

    grammar: str
    templates: list[Any]
    turn: int = 0


def _native_tokens() -> Any:
    """The C tokenizer table's module, or None where the extension was not built."""
    try:
        from aserve.sampling import _grammar_tokens  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _grammar_tokens


def _grammar_text(spec: StructuredOutputs) -> str:
    import llguidance

    try:
        if spec.json is not None or spec.json_object:
            schema = _ANY_OBJECT_SCHEMA if spec.json is None else str(spec.json)
            return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_LAYOUT))
        if spec.regex is not None:
            return str(llguidance.LLMatcher.grammar_from_regex(spec.regex))
        if spec.choice is not None:
            # A Lark alternation of JSON-quoted literals: Lark strings take JSON escapes.
            alts = " | ".join(json.dumps(c) for c in spec.choice)
            return str(llguidance.LLMatcher.grammar_from_lark(f"start: {alts}"))
        assert spec.grammar is not None
        return str(llguidance.LLMatcher.grammar_from_lark(spec.grammar))
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"structured_outputs: {exc}", param="structured_outputs") from exc


class _GreedyTokenizer:
    """Longest-match tokenization over the vocabulary's token bytes (normal tokens only)."""

    def __init__(self, token_bytes: Sequence[bytes]) -> None:
        self._ids: dict[bytes, int] = {}
        for i, b in enumerate(token_bytes):
            if b:
                self._ids.setdefault(b, i)
        self._longest = max((len(b) for b in self._ids), default=1)

    def __call__(self, text: bytes) -> tuple[int, ...]:
        out: list[int] = []
        pos = 0
        while pos < len(text):
            for n in range(min(self._longest, len(text) - pos), 0, -1):
                i = self._ids.get(text[pos : pos + n])
                if i is not None:
                    out.append(i)
                    pos += n
                    break
            else:
                raise ValueError(f"no token spells {text[pos : pos + 1]!r}")
        return tuple(out)


class GrammarState:
    """One constrained request's matcher. Owned by the event loop: the committer advances it
    (so it always reflects committed tokens), and the launch path reads its mask, on the
    loop's thread or on a :class:`MaskFiller` thread while the loop waits for that fill.

    While the output is at most :data:`MASK_CACHE_PREFIX` tokens long, ``prefix`` holds it:
    a matcher's state is a function of its grammar and the tokens it consumed, so its mask can
    be looked up in ``cache`` by ``(key, prefix)`` instead of computed.

    ``token_table`` is set when the matcher's tokenizer is the C table, whose masks may be
    computed on llguidance's threads (:class:`MaskFiller`)."""

    __slots__ = ("cache", "filler", "key", "matcher", "prefix", "shard", "token_table", "vocab_size")

    def __init__(
        self,
        matcher: Any,
        vocab_size: int,
        cache: MaskCache | None = None,
        key: tuple[str, str] | None = None,
        token_table: Any = None,
        shard: int = 0,
        filler: MaskFiller | None = None,
    ) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.cache = cache
        self.key = key
        # The C table the matcher's tokenizer calls (kept alive with the matcher), if any.
        self.token_table = token_table
        self.shard = shard  # the template the matcher was copied from (Grammars._matcher)
        self.filler = filler  # what fills its masks (fill_masks; MASK_FILLER if None)
        self.prefix: list[int] | None = [] if cache is not None and key is not None else None

    def advance(self, token: int) -> bool:
        """Consume a committed token; False if the grammar did not allow it."""
        self._note(token)
        return bool(self.matcher.consume_token(token))

    def _note(self, token: int) -> None:
        prefix = self.prefix
        if prefix is not None:
            if len(prefix) < MASK_CACHE_PREFIX:
                prefix.append(token)
            else:
                self.prefix = None

    @property
    def done(self) -> bool:
        """The language allows no further token (the output is complete)."""
        return bool(self.matcher.is_stopped())

    @property
    def error(self) -> str:
        return str(self.matcher.get_error())


def advance_all(states: Sequence[GrammarState], tokens: Sequence[int]) -> list[bool]:
    """``states[i].advance(tokens[i])`` for every i (a step's commit): through the first
    state's filler, in one GIL-free call on its pool when it has one and there are
    :data:`_MIN_POOL_ADVANCE` rows or more (grouped by template, as a fill's), else one by one."""
    filler = states[0].filler if states else None
    # A token costs ~1 us to consume: the pool's wake-up pays only at a large batch (mask_fill
    # bench on this project's VM: 64 rows 0.055 ms one by one, 0.090 on 2 threads; 256 rows
    # 0.31-0.33 against 0.23-0.32).
    if filler is None or len(states) < _MIN_POOL_ADVANCE or not filler.pooled(states, len(states)):
        return [st.advance(t) for st, t in zip(states, tokens, strict=True)]
    for st, t in zip(states, tokens, strict=True):
        st._note(t)
    order = sorted(range(len(states)), key=lambda i: states[i].shard)
    done = filler._pool().consume_token_par([(states[i].matcher, tokens[i]) for i in order])
    filler.pool_consumes += 1
    ok = [False] * len(states)
    for i, res in zip(order, done, strict=True):
        ok[i] = bool(res)
    return ok


# Outputs up to this many tokens long have their masks cached (a JSON schema's opening keys,
# an enum, a choice: the first tokens of most constrained outputs are the same).
MASK_CACHE_PREFIX = 16


class MaskCache:
    """Masks by ``(grammar key, committed tokens)``, least recently stored dropped first.

    The first steps of requests that share a schema are often identical (the grammar forces
    ``{"name": "``; every enum output starts from the same state), and a mask costs 13-20 us
    to compute on the H200 host against ~2 us to copy (docs/benchmarks.md, "Mask fill
    without the GIL"): more cores did not make computing masks faster there."""

    def __init__(self, entries: int = 512, sightings: int = 16384) -> None:
        self.entries = entries
        self._masks: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        # A state's mask is stored the second time the state is met: outputs that part ways
        # at once (numbers, free text) then cost one dict update a row, not a 32 KiB copy.
        self._seen: dict[tuple[Any, ...], int] = {}
        self._sightings = sightings
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[Any, ...]) -> bytes | None:
        """The stored mask (a hit), or None (a miss). ``hits`` also counts the rows a fill
        copied from an earlier row of the same step in the same state."""
        mask = self._masks.get(key)
        if mask is None:
            self.misses += 1
        else:
            self.hits += 1
        return mask

    def met_again(self, key: tuple[Any, ...]) -> bool:
        """Count a miss on ``key``; True from the second one on (then store its mask)."""
        seen = self._seen
        if len(seen) >= self._sightings:
            seen.clear()
        n = seen.get(key, 0) + 1
        seen[key] = n
        return n > 1

    def put(self, key: tuple[Any, ...], mask: bytes) -> None:
        self._masks[key] = mask
        if len(self._masks) > self.entries:
            self._masks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._masks)


def fill_masks(states: Sequence[GrammarState], out: torch.Tensor | None = None) -> torch.Tensor:
    """[R, words] int32 host bitmasks of the tokens each state allows next (into ``out``, a
    contiguous host tensor of that shape, when given).

    Through the first state's filler (:data:`MASK_FILLER` if it has none). A matcher that is
    stopped or failed (its request has ended; a split launch may still sample one more token
    for it, which is never committed) allows every token."""
    words = mask_words(states[0].vocab_size)
    masks = torch.empty((len(states), words), dtype=torch.int32) if out is None else out
    assert masks.shape == (len(states), words) and masks.is_contiguous()
    filler = states[0].filler
    (MASK_FILLER if filler is None else filler).fill(states, masks.data_ptr(), words * 4)
    return masks


_MIN_POOL_ROWS = 16
_MIN_POOL_ADVANCE = 128  # rows a commit's grammar advance needs for the pool (advance_all)


class MaskFiller:
    """Fills a step's masks one row after another on the calling thread (``serial``) or, for
    the rows the mask cache does not answer, in one GIL-free call on llguidance's pool of N
    native threads (``executor:N``). ``ASERVE_MASK_FILL`` picks one; unset, the executor with
    :func:`default_fill_threads` threads, or serial where that is one (and on a CPU device:
    :meth:`for_device`).

    The executor needs the C tokenizer table (``GrammarState.token_table``): with the Python
    tokenizer every pool thread takes the GIL for the bytes a grammar forces, and a pool of
    them measured slower than the serial loop (docs/benchmarks.md, "Mask fill without the
    GIL"); such steps are filled serially."""

    def __init__(self, spec: str | None = None) -> None:
        spec = spec if spec is not None else os.environ.get("ASERVE_MASK_FILL", "")
        kind, _, n = spec.partition(":")
        if spec == "":
            self.threads = default_fill_threads()
            kind = "serial" if self.threads == 1 else "executor"
        elif spec == "serial":
            self.threads = 1
        elif spec == "executor":
            self.threads = max(2, default_fill_threads())
        elif kind == "executor" and n.isdecimal() and n.isascii() and int(n) >= 1:
            self.threads = int(n)
        else:
            raise ValueError(f"ASERVE_MASK_FILL: unknown strategy {spec!r} (serial, executor or executor:N)")
        self.kind = kind
        self.pool_consumes = 0  # commits whose grammar rows advanced on the pool (advance_all)
        self._executor: Any = None
        self._lock = threading.Lock()

    @classmethod
    def for_device(cls, device_type: str) -> MaskFiller:
        """An engine's filler: ``ASERVE_MASK_FILL``'s; unset, serial on a CPU device (its
        forward runs on the same cores while the masks are filled) and the default elsewhere."""
        spec = os.environ.get("ASERVE_MASK_FILL", "")
        return cls(spec or ("serial" if device_type == "cpu" else ""))

    @property
    def spec(self) -> str:
        return "serial" if self.kind == "serial" else f"executor:{self.threads}"

    def fill(self, states: Sequence[GrammarState], base: int, row_bytes: int) -> None:
        compute: list[tuple[Any, int]] = []  # (matcher, row) whose masks are computed
        first: dict[tuple[Any, ...], int] = {}  # cache key -> the step's row that computes it
        copies: list[tuple[int, int]] = []  # (row, row it copies) for rows in an earlier row's state
        store: dict[tuple[Any, ...], int] = {}  # cache key -> row whose mask the cache keeps
        for i, st in enumerate(states):
            m = st.matcher
            dst = base + i * row_bytes
            if m.is_stopped() or m.is_error():
                ctypes.memset(dst, 0xFF, row_bytes)
                continue
            prefix, cache = st.prefix, st.cache
            if prefix is not None and cache is not None:
                key = (st.key, *prefix)
                mask = cache.get(key)
                if mask is not None:
                    ctypes.memmove(dst, mask, row_bytes)
                    continue
                if key in first:  # met again within the step: copied, and kept from now on
                    cache.hits += 1
                    copies.append((i, first[key]))
                    store[key] = first[key]
                    continue
                first[key] = i
                if cache.met_again(key):
                    store[key] = i
            compute.append((m, i))
        if self.pooled(states, len(compute)):
            # Rows grouped by template: the pool hands each thread a contiguous run of the
            # list, so a thread mostly takes its own template's lock (Grammars._matcher).
            compute.sort(key=lambda mi: states[mi[1]].shard)
            self._pool().unsafe_compute_mask_ptr(compute, base, row_bytes, len(states))
        else:
            for m, i in compute:
                m.unsafe_compute_mask_ptr(base + i * row_bytes, row_bytes)
        for i, j in copies:
            ctypes.memmove(base + i * row_bytes, base + j * row_bytes, row_bytes)
        for key, i in store.items():
            cast(MaskCache, states[i].cache).put(key, ctypes.string_at(base + i * row_bytes, row_bytes))

    def pooled(self, states: Sequence[GrammarState], rows: int) -> bool:
        """Whether ``rows`` of these states' rows go to the pool: an executor, the C table,
        and enough rows (its wake-up costs more than it saves below ~16 rows a thread on this
        project's VM, mask_fill bench)."""
        return self.kind == "executor" and rows >= 2 * _MIN_POOL_ROWS and states[0].token_table is not None

    def _pool(self) -> Any:
        with self._lock:
            if self._executor is None:
                import llguidance

                self._executor = llguidance.LLExecutor(self.threads)
            return self._executor


def default_fill_threads() -> int:
    """The executor's threads unless ``ASERVE_MASK_FILL`` says otherwise: a quarter of the
    cores this process may run on, at most 8 (the rest plan, commit, serve and feed the
    device); 1 (serial) below 8 cores. Not yet measured on the H200 host (docs/benchmarks.md,
    "Issue 16: the lock behind the mask fill")."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(8, cpus // 4) if cpus >= 8 else 1


MASK_FILLER = MaskFiller()


def allowed_tokens(masks: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, words] int32 bitmasks -> [R, vocab_size] bool (on the masks' device, no sync)."""
    shifts = torch.arange(32, dtype=torch.int32, device=masks.device)
    bits = torch.bitwise_and(torch.bitwise_right_shift(masks.unsqueeze(-1), shifts), 1)  # [R, W, 32]
    return bits.view(masks.shape[0], -1)[:, :vocab_size].bool()

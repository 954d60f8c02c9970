"""Structured outputs: compiling a request's grammar into llguidance matchers (cached by key).

One :class:`Grammars` per engine. Its llguidance tokenizer (every token's bytes: ~1.3 s for
the default model's 262k vocabulary on one core) is built at the first structured request
(most engines never see one) and is what each request's ``LLMatcher`` walks. Where the
pieces run, and how a constrained step splits its launch under the overlap scheduler, is in
``docs/architecture.md`` ("Structured outputs").

* admission: :meth:`Grammars.state` compiles the request's grammar (cached by its key, so
  the next request with the same schema gets a copy of a ready matcher) or raises a typed 400;
* launch, sampling and commit: the request's :class:`~aserve.sampling.masks.GrammarState`,
  its masks and its advance (:mod:`aserve.sampling.masks`).

Why llguidance and not xgrammar: it needs no ``transformers`` at run time (xgrammar builds
its tokenizer info from a transformers tokenizer), takes any vocabulary as a list of token
bytes, builds a matcher in ~1 ms and a 262k-token mask in 5-40 us on one core (measured here
with the default model and a JSON schema; both are vLLM's backends, and llama.cpp's is llguidance).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aserve.errors import InvalidRequestError
from aserve.logs import get_logger
from aserve.sampling.fsm import FsmBuilds, FsmState, TokenFSM, automata_on
from aserve.sampling.masks import GrammarState, MaskCache, MaskFiller
from aserve.sampling_params import StructuredOutputs

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

    from aserve.tokenizer.tokenizer import Tokenizer

log = get_logger("aserve.grammar")

# Compiled grammars kept (a pristine matcher each; requests get deep copies).
_CACHE_SIZE = 256
# Templates kept across all of them (a used template's lexer held ~0.2-0.3 MiB on this
# project's VM for the bench schemas): past it the least recently used grammars are dropped
# (recompiled if asked again; live requests keep their copies), and a grammar alone over it
# shares the templates it has.
_MAX_TEMPLATES = 1024
# A JSON object of any shape (OpenAI's response_format json_object).
_ANY_OBJECT_SCHEMA = json.dumps({"type": "object"})
# JSON is written as json.dumps writes it: ", " and ": " and no other whitespace. With the
# grammar's default (any run of whitespace between tokens) the default model, sampled, filled
# outputs with tabs and newlines until max_tokens in 1 of ~30 requests. A schema may still
# ask for another layout in its own "x-guidance" object (llguidance's JSON options).
_JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


# Templates a grammar keeps per thread of the mask fill's pool (Grammars._matcher). With one
# per thread, a step's rows grouped by template, the pool's threads still met on a template's
# lexer lock (work stealing hands a thread part of another's run): on a 16-core H100 host 256
# rows of the structured bench filled in 0.74 ms on 8 threads, 0.51 with 4 templates a thread,
# 0.45 with 16 and 0.44 with a matcher of its own for every row (session 21, docs/benchmarks.md,
# templates.py). Each template is compiled once (0.2-0.6 ms on this project's VM).
TEMPLATES_PER_THREAD = 4


class Grammars:
    """The engine's grammar compiler: an llguidance tokenizer and compiled-grammar cache."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        native_tokens: bool | None = None,
        filler: MaskFiller | None = None,
        fsm: bool | None = None,
    ) -> None:
        """``native_tokens``: give llguidance the C tokenizer table when the extension is built
        (None: unless ``ASERVE_GRAMMAR_TOKENS=python``; False: always the Python callback).
        ``filler``: how the requests' masks are filled (a :class:`MaskFiller` of its own, from
        ``ASERVE_MASK_FILL``, unless given; an engine passes :meth:`MaskFiller.for_device`).
        ``fsm``: constrain choices and JSON schemas of :mod:`aserve.sampling.fsm`'s subset by a
        token automaton once it is built (None: as :func:`automata_on` says for a CPU)."""
        self.vocab_size = vocab_size
        self.filler = MaskFiller() if filler is None else filler
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
        if fsm is None:
            fsm = automata_on("cpu")
        self.fsms: FsmBuilds | None = None
        if fsm:
            self.fsms = FsmBuilds(tokenizer, vocab_size)

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

    def prepare(self) -> None:
        """Build llguidance's tokenizer now (a failure is kept for the requests that need it):
        ~1 s over a 262k vocabulary on this project's VM, several on a loaded one. Called on a
        worker thread by a server before it says it is ready; otherwise the first structured
        request builds it, on the loop that plans and commits."""
        with self._lock:
            if self._ll_tokenizer is None and self._error is None:
                self._build()

    def _ll(self) -> Any:
        self.prepare()
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
        fsm = self._automaton(spec, compiled)
        if fsm is not None:
            return FsmState(fsm, self.vocab_size, filler)
        pooled = filler.kind == "executor" and self.token_table is not None
        shards = filler.threads * TEMPLATES_PER_THREAD if pooled else 1
        shard = compiled.turn % shards
        compiled.turn += 1
        matcher = self._matcher(compiled, shard)
        cache, key = (self.masks, spec.key) if cached else (None, None)
        return GrammarState(matcher, self.vocab_size, cache, key, self.token_table, shard, filler)

    def build_automaton(self, spec: StructuredOutputs) -> None:
        """Queue ``spec``'s token automaton, if automata are on and it has none yet (its
        grammar compiled first: a bad one raises :class:`InvalidRequestError`)."""
        if self.fsms is not None:
            self._automaton(spec, self._compiled(spec))

    def _automaton(self, spec: StructuredOutputs, compiled: _Compiled) -> TokenFSM | None:
        """``spec``'s automaton if automata are on and it is built, else None (its build queued
        with a fresh state of ``compiled`` to judge by, which keeps the C tokenizer table its
        matcher calls alive while the build runs)."""
        if self.fsms is None:
            return None

        def judge() -> GrammarState:
            return GrammarState(self._matcher(compiled, 0), self.vocab_size, token_table=self.token_table)

        return self.fsms.get(spec, judge)

    def _matcher(self, compiled: _Compiled, shard: int) -> Any:
        """A fresh ``llguidance.LLMatcher``: a copy of ``compiled``'s template number ``shard``.

        Copies of one compiled matcher share its lexer behind one lock (llguidance's parser
        keeps it in an ``Arc<Mutex<..>>`` that ``deep_copy`` shares), so their masks cannot be
        computed at the same time: on this project's 2-core VM two Python threads filling
        copies of one template ran 1.9x slower than one thread, and llguidance's pool of two on
        copies of two templates (rows grouped by template) 1.8x faster than one thread
        (docs/benchmarks.md, "Issue 16: the lock behind the mask fill"). A grammar
        therefore has up to :data:`TEMPLATES_PER_THREAD` templates per fill thread, each
        compiled on first use."""
        import llguidance

        templates = compiled.templates
        while len(templates) <= shard:
            if self._templates >= _MAX_TEMPLATES and not self._drop_lru_but(compiled):
                return templates[shard % len(templates)].deep_copy()
            templates.append(llguidance.LLMatcher(self._ll(), compiled.grammar, log_level=0))
        return templates[shard].deep_copy()

    @property
    def _templates(self) -> int:
        """Templates across the cache (held to :data:`_MAX_TEMPLATES`; counted only when one
        is about to be compiled)."""
        return sum(len(c.templates) for c in self._cache.values())

    def _drop_lru_but(self, keep: _Compiled) -> bool:
        """Drop the least recently used grammar other than ``keep`` (for its templates' memory);
        False if there is none."""
        for key, compiled in self._cache.items():
            if compiled is not keep:
                del self._cache[key]
                return True
        return False

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
    number of requests that took one (the next takes ``templates[turn % shards]``)."""

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

"""A step's grammar work on the host: each constrained request's state, the rows' token masks
(filled serially or on llguidance's thread pool, with a cache by grammar state) and the
commit's advance of the matchers. The grammars themselves are compiled in
:mod:`aserve.sampling.grammar`; where each piece runs under the overlap scheduler is in
``docs/architecture.md`` ("Structured outputs").

* launch (host): :func:`fill_masks` writes each constrained row's allowed-token bitmask; a
  step launched while earlier ones are in flight fills them after those commits, while the
  device runs its forward (the split launch);
* sampling (device): the sampler sends masked-out logits to -inf (aserve/kernels/bitmask.py
  on CUDA, ``apply_masks_``'s C pass on a CPU);
* commit: :func:`advance_all` advances the matchers by the sampled tokens; a matcher that is
  stopped (the language allows nothing more) ends the request with ``"stop"``.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import torch


def mask_words(vocab_size: int) -> int:
    """int32 words in one row's bitmask (bit ``t % 32`` of word ``t // 32`` allows token t)."""
    return (vocab_size + 31) // 32


class GrammarState:
    """One constrained request's matcher. Owned by the event loop: the committer advances it
    (so it always reflects committed tokens), and the launch path reads its mask, on the
    loop's thread or on a :class:`MaskFiller` thread while the loop waits for that fill.

    While the output is at most :data:`MASK_CACHE_PREFIX` tokens long, ``prefix`` holds it:
    a matcher's state is a function of its grammar and the tokens it consumed, so its mask can
    be looked up in ``cache`` by ``(key, prefix)`` instead of computed.

    ``token_table`` is set when the matcher's tokenizer is the C table, whose masks may be
    computed on llguidance's threads (:class:`MaskFiller`)."""

    __slots__ = (
        "cache",
        "done",
        "error",
        "filler",
        "fsm",
        "key",
        "matcher",
        "prefix",
        "shard",
        "token_table",
        "vocab_size",
    )

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
        self.filler = filler  # what fills its masks (fill_masks; serially if None)
        self.fsm: Any = None  # a token automaton in the matcher's place (aserve.sampling.fsm.FsmState)
        self.prefix: list[int] | None = [] if cache is not None and key is not None else None
        # As of the last advance (the only calls that move a matcher), read by the commit and
        # the fill: two calls into llguidance a row fewer there.
        # the language allows no further token (the output is complete); why the grammar refused
        # a token (an automaton's state, with no matcher, sets its own)
        self.done = matcher is not None and bool(matcher.is_stopped())
        self.error = str(matcher.get_error()) if matcher is not None and matcher.is_error() else ""

    def advance(self, token: int) -> bool:
        """Consume a committed token; False if the grammar did not allow it."""
        self._note(token)
        return self._took(bool(self.matcher.consume_token(token)))

    def _took(self, ok: bool) -> bool:
        """Record ``done`` and ``error`` after an advance."""
        m = self.matcher
        self.done = bool(m.is_stopped())
        self.error = "" if ok else str(m.get_error())
        return ok

    def _note(self, token: int) -> None:
        prefix = self.prefix
        if prefix is not None:
            if len(prefix) < MASK_CACHE_PREFIX:
                prefix.append(token)
            else:
                self.prefix = None


def advance_all(states: Sequence[GrammarState], tokens: Sequence[int]) -> list[bool]:
    """``states[i].advance(tokens[i])`` for every i (a step's commit): through the first
    state's filler, in one GIL-free call on its pool when it has one and there are
    :data:`_MIN_POOL_ADVANCE` rows or more (grouped by template, as a fill's), else one by one."""
    filler = states[0].filler if states else None
    if any(st.fsm is not None for st in states):  # an automaton's advance is one lookup
        return [st.advance(t) for st, t in zip(states, tokens, strict=True)]
    # A token costs ~1 us to consume: the pool's wake-up pays only at a large batch (mask_fill
    # bench on this project's VM: 64 rows 0.055 ms one by one, 0.090 on 2 threads; 256 rows
    # 0.31-0.33 against 0.23-0.32).
    if filler is None or len(states) < _MIN_POOL_ADVANCE or not filler.pooled(states, len(states)):
        return [st.advance(t) for st, t in zip(states, tokens, strict=True)]
    # Per-row Python kept short: on the H100 hosts it ran ~0.3 ms a 256-row step before the
    # pool's call (the commit waits for it there, docs/benchmarks.md, session 22).
    for st, t in zip(states, tokens, strict=True):
        if st.prefix is not None:
            st._note(t)
    order = sorted(range(len(states)), key=[st.shard for st in states].__getitem__)
    done = filler._pool().consume_token_par([(states[i].matcher, tokens[i]) for i in order])
    filler.pool_consumes += 1
    ok = [False] * len(states)
    for i, res in zip(order, done, strict=True):
        ok[i] = states[i]._took(bool(res))
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


FillRunner = Callable[[Callable[[], None]], None]
"""Runs a fill's GIL-free part (its argument) and returns once that is done. A split step's
sampler takes the step loop's (:class:`FillBeside`), which runs it on a helper thread while the
loop commits the step before; without one the fill runs on the calling thread."""


def fill_masks(
    states: Sequence[GrammarState], out: torch.Tensor | None = None, beside: FillRunner | None = None
) -> torch.Tensor:
    """[R, words] int32 host bitmasks of the tokens each state allows next (into ``out``, a
    contiguous host tensor of that shape, when given).

    Through the first state's filler (serially if it has none). A matcher that is
    stopped or failed (its request has ended; a split launch may still sample one more token
    for it, which is never committed) allows every token. ``beside`` runs the rows computed
    on the filler's pool, if any (the native call, without the GIL); the rest of the fill
    (cache look-ups and stores, copies) runs here before and after it."""
    words = mask_words(states[0].vocab_size)
    masks = torch.empty((len(states), words), dtype=torch.int32) if out is None else out
    assert masks.shape == (len(states), words) and masks.is_contiguous()
    filler = states[0].filler
    (MaskFiller("serial") if filler is None else filler).fill(states, masks.data_ptr(), words * 4, beside)
    return masks


_MIN_POOL_ROWS = 16
_MIN_POOL_ADVANCE = 128  # rows a commit's grammar advance needs for the pool (advance_all)


class MaskFill:
    """One step's mask fill, in three parts: :meth:`MaskFiller.prepare` (on the calling
    thread), :meth:`compute` (the rows whose masks a matcher computes: with ``pooled``, one
    call on llguidance's pool that holds no GIL, so it may run on another thread while the
    caller's runs Python) and :meth:`finish` (copies within the step and cache stores, on the
    calling thread again)."""

    __slots__ = ("base", "copies", "pool", "pooled", "row_bytes", "rows", "states", "store")

    def __init__(self, states: Sequence[GrammarState], base: int, row_bytes: int) -> None:
        self.states, self.base, self.row_bytes = states, base, row_bytes
        self.rows: list[tuple[Any, int]] = []  # (matcher, row) whose masks are computed
        self.copies: list[tuple[int, int]] = []  # (row, row it copies) for rows in an earlier row's state
        self.store: dict[tuple[Any, ...], int] = {}  # cache key -> row whose mask the cache keeps
        self.pooled = False
        self.pool: Any = None

    def compute(self) -> None:
        base, row_bytes = self.base, self.row_bytes
        if self.pooled:
            self.pool.unsafe_compute_mask_ptr(self.rows, base, row_bytes, len(self.states))
        else:
            for m, i in self.rows:
                m.unsafe_compute_mask_ptr(base + i * row_bytes, row_bytes)

    def finish(self) -> None:
        base, row_bytes = self.base, self.row_bytes
        for i, j in self.copies:
            ctypes.memmove(base + i * row_bytes, base + j * row_bytes, row_bytes)
        for key, i in self.store.items():
            cast(MaskCache, self.states[i].cache).put(key, ctypes.string_at(base + i * row_bytes, row_bytes))


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

    def fill(self, states: Sequence[GrammarState], base: int, row_bytes: int, beside: FillRunner | None = None) -> None:
        """The three parts of a fill in turn; ``beside`` runs the pooled compute, if any."""
        job = self.prepare(states, base, row_bytes)
        if job.pooled and beside is not None:
            beside(job.compute)
        else:
            job.compute()
        job.finish()

    def prepare(self, states: Sequence[GrammarState], base: int, row_bytes: int) -> MaskFill:
        """A fill's first part: rows that need no matcher (ended ones, cache hits, a state met
        earlier in the step) are settled or noted; the rest are left to :meth:`MaskFill.compute`."""
        job = MaskFill(states, base, row_bytes)
        first: dict[tuple[Any, ...], int] = {}  # cache key -> the step's row that computes it
        for i, st in enumerate(states):
            m = st.matcher
            dst = base + i * row_bytes
            if st.done or st.error:  # as of its last advance (the only calls that move a matcher)
                ctypes.memset(dst, 0xFF, row_bytes)
                continue
            if st.fsm is not None:  # its state's row of the automaton's masks
                ctypes.memmove(dst, st.fsm.mask_ptr(st.state), row_bytes)  # type: ignore[attr-defined]
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
                    job.copies.append((i, first[key]))
                    job.store[key] = first[key]
                    continue
                first[key] = i
                if cache.met_again(key):
                    job.store[key] = i
            job.rows.append((m, i))
        job.pooled = self.pooled([states[i] for _, i in job.rows[:1]], len(job.rows))
        if job.pooled:
            # Rows grouped by template: the pool hands each thread a contiguous run of the
            # list, so a thread mostly takes its own template's lock (Grammars._matcher).
            job.rows.sort(key=lambda mi: states[mi[1]].shard)
            job.pool = self._pool()
        return job

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


class FillBeside:
    """Runs a step's mask fill beside other work: :meth:`run` hands the fill's GIL-free part to
    a helper thread and runs ``meanwhile`` (the rest of a commit) on the calling thread.

    The caller waits until the helper has started before it goes on: a thread woken while
    another runs Python waits for the GIL up to the switch interval (5 ms), so a plain submit
    would let the fill begin only once the caller blocks on its result. Started, the helper
    enters the native call at once and drops the GIL there. When the fill returns first it
    waits for the GIL until ``meanwhile`` ends, which costs nothing: the caller waits for the
    fill next (docs/architecture.md, "Structured outputs")."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self.runs = 0  # fills that ran beside other work

    def run(self, work: Callable[[], None], meanwhile: Callable[[], None]) -> None:
        """``work()`` on the helper thread and ``meanwhile()`` here; returns once both are done
        (an exception from either is raised, ``meanwhile``'s first)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="aserve-fill")
        started = threading.Event()

        def job() -> None:
            started.set()
            work()

        done = self._executor.submit(job)
        started.wait()
        self.runs += 1
        try:
            meanwhile()
        finally:
            error = done.exception()  # waits for the fill, whatever ``meanwhile`` did
        if error is not None:
            raise error

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def default_fill_threads() -> int:
    """The executor's threads unless ``ASERVE_MASK_FILL`` says otherwise: half the cores this
    process may run on, at most 8 (the rest plan, commit, serve and feed the device; the pool's
    threads run only while a step's masks fill); 1 (serial) below 8 cores. On four H100 hosts
    of 16 cores (sessions 20 and 21, docs/benchmarks.md) 8 threads beat 4 in 9 of 12 paired
    constrained decode runs at batch 64 and 256, the other three on one host."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(8, cpus // 2) if cpus >= 8 else 1


def allowed_tokens(masks: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, words] int32 bitmasks -> [R, vocab_size] bool (on the masks' device, no sync)."""
    shifts = torch.arange(32, dtype=torch.int32, device=masks.device)
    bits = torch.bitwise_and(torch.bitwise_right_shift(masks.unsqueeze(-1), shifts), 1)  # [R, W, 32]
    return bits.view(masks.shape[0], -1)[:, :vocab_size].bool()

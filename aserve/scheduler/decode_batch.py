"""The persistent decode batch: running requests that decode plainly, kept as columns.

Most steps of a busy engine are the same requests decoding one more token each. Planning
them one ``SeqPlan`` at a time costs the event loop ~0.7 µs per request per step on this
project's CPU (and the input build and the commit as much again), which at batch 256 and
512 is longer than the device's step. So the requests that decode without anything per-step
to decide (no penalty, no logprobs, no stop strings, no ``min_tokens``: the common case,
"plain"; a grammar is allowed, its rows listed apart) stay in a :class:`DecodeBatch` from
the step after their prefill until they end: their rows, positions, slots and next output
indexes live in plain lists (the policy imports no numpy), each step's are one list
comprehension from the last's (a page is allocated only where a position starts a new page,
one request in ``page_size`` a step), and the step's snapshot is a :class:`DecodeBlock` of
columns rather than one object per request.

The requests' planned counters (``num_computed``, ``num_launched_outputs``) are still
advanced on each ``Req``, so everything that reads a request (release, retraction, the
prefix cache, stats) sees what it always saw. Members leave when they end (every end, an
abort included, passes the committer's ``finish``, which names them in ``leaving``; the batch
finds them with ``list.index``, an identity scan in C, so a step where a few requests end
costs no pass over the batch in Python), when their launched outputs reach their length
(checked when the smallest number of steps any member has left runs out), or all at once
when the planner falls back to its general path (KV short, more decodes than the token
budget) or retracts: then the batch is rebuilt from the running requests. :class:`Decoders`
keeps the batch, the other decoders and the requests about to join.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aserve.kv.allocator import KVAllocator
from aserve.scheduler.req import Req
from aserve.scheduler.seq import SeqPlan


def is_plain(req: Req) -> bool:
    """Whether ``req``'s decodes need no per-step decision of the planner, and of the
    committer none but its grammar's advance (a constrained request joins the batch unless
    ``ASERVE_SPLIT_MASKS=0`` makes it wait for every commit: ``Decoders.constrained``)."""
    p = req.params
    return (
        (req.grammar is None) == (p.structured_outputs is None)
        and not p.has_penalty
        and p.logprobs is None
        and not p.stop
        and p.min_tokens == 0
    )


@dataclass(slots=True, eq=False)
class DecodeBlock:
    """One step's plain decodes as columns, in launch order (the step's snapshot of them).
    Its lists are never changed after planning: the batch builds new ones each step."""

    reqs: list[Req]
    rows: list[int]
    gens: list[int]
    positions: list[int]
    slots: list[int]
    output_index: list[int]
    greedy: bool  # every member's token is the argmax (of its masked logits, if constrained)
    # The members a grammar constrains: their indexes in the block, and their matchers.
    grammar_idx: list[int]
    grammars: list[Any]

    def __len__(self) -> int:
        return len(self.reqs)

    def check(self, page_size: int, max_context: int, max_lookahead: int) -> None:
        """Debug: the columns agree with their requests (what the one-by-one path asserts)."""
        ps = page_size
        for i, r in enumerate(self.reqs):
            pos, out = self.positions[i], self.output_index[i]
            assert self.rows[i] == r.row and self.gens[i] == r.generation, (r.rid, self.rows[i], r.row)
            assert pos < max_context and pos < len(r.pages) * ps, (r.rid, pos, len(r.pages))
            assert self.slots[i] == r.pages[pos // ps] * ps + pos % ps, (r.rid, pos, self.slots[i])
            assert (pos, out) == (r.num_computed - 1, r.num_launched_outputs - 1), (r.rid, pos, out)
            assert out - len(r.output_ids) <= max_lookahead, f"look-ahead {out - len(r.output_ids)} for {r.rid}"

    def seq_plans(self) -> list[SeqPlan]:
        """The same decodes as ``SeqPlan``\\ s: for the decode-graph fast path when other
        decodes come with the block, for debug checks and for tests. ``pending_output`` reads
        the committed state when they are built, which may be after a later commit (debug
        checks); it is read only for penalised requests, which never join a block."""
        cols = zip(self.reqs, self.rows, self.gens, self.positions, self.slots, self.output_index, strict=True)
        return [
            SeqPlan(r, row, gen, pos, 1, [slot], None, True, out, out > len(r.output_ids))
            for r, row, gen, pos, slot, out in cols
        ]


class DecodeBatch:
    """The plain decoders, as columns advanced step after step.

    Plain lists, as everywhere in the policy: a step's columns are three list
    comprehensions and a scan for page starts, ~0.1 µs per request."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.reqs: list[Req] = []
        self.rows: list[int] = []
        self.gens: list[int] = []
        self.pos: list[int] = []  # the position each decodes next (its num_computed)
        self.slot: list[int] = []  # its KV slot (-1: ``pos`` starts a page, found when planned)
        self.out: list[int] = []  # the output index it samples next (num_launched_outputs)
        self.limit: list[int] = []  # max_new_tokens
        self.grammar_idx: list[int] = []  # members with a grammar (rebuilt when members change)
        self.grammars: list[Any] = []  # their matchers (GrammarState)
        self.steps_left = 0  # steps until a member's launched outputs may reach its limit (a lower bound)
        self.greedy = True
        self.leaving: list[Req] = []  # requests that ended since the last plan
        self.starts: list[int] = []  # members whose position starts a page this step (``settle``)

    def __len__(self) -> int:
        return len(self.reqs)

    def join(self, reqs: list[Req]) -> None:
        """Add decoders (prefill done, plain): read their planned state once."""
        ps = self.page_size
        pos = [r.num_computed for r in reqs]
        rows = [r.row for r in reqs if r.row is not None]
        assert len(rows) == len(reqs), "a decoder without a row"
        out = [r.num_launched_outputs for r in reqs]
        limit = [r.max_new_tokens for r in reqs]
        left = min(lim - o for lim, o in zip(limit, out, strict=True))
        self.steps_left = left if not self.reqs else min(self.steps_left, left)
        self.reqs = self.reqs + reqs  # new lists: blocks already planned keep theirs
        self.rows = self.rows + rows
        self.gens = self.gens + [r.generation for r in reqs]
        self.pos = self.pos + pos
        self.slot = self.slot + [r.pages[p // ps] * ps + p % ps if p % ps else -1 for r, p in zip(reqs, pos)]
        self.out = self.out + out
        self.limit = self.limit + limit
        self.greedy = self.greedy and all(r.params.is_greedy_argmax for r in reqs)
        if any(r.grammar is not None for r in reqs):
            self._index_grammars()

    def _index_grammars(self) -> None:
        """``grammar_idx`` and ``grammars`` from the members (new lists: blocks keep theirs)."""
        reqs = self.reqs
        self.grammar_idx = [i for i, r in enumerate(reqs) if r.grammar is not None]
        self.grammars = [reqs[i].grammar for i in self.grammar_idx]

    def _drop(self, drop: list[int]) -> None:
        """Remove the members at ``drop`` (ascending) from copies of the columns."""
        for name in ("reqs", "rows", "gens", "pos", "slot", "out", "limit"):
            col = getattr(self, name).copy()
            for i in reversed(drop):
                del col[i]
            setattr(self, name, col)
        if not self.greedy:
            self.greedy = all(r.params.is_greedy_argmax for r in self.reqs)
        if self.grammar_idx:
            self._index_grammars()

    def settle(self) -> None:
        """Drop members that ended (``leaving``) and those whose launched outputs reached their
        length (they launch nothing more; the commit ends them); find this step's page starts."""
        drop: set[int] = set()
        if self.leaving:
            reqs = self.reqs
            # ``in`` first: a miss (not a member) would make ``index`` build its ValueError's
            # message from the request's repr.
            drop.update(reqs.index(r) for r in self.leaving if r in reqs)
            self.leaving.clear()
        recount = self.steps_left <= 0
        if recount:
            drop.update(i for i, (o, lim) in enumerate(zip(self.out, self.limit, strict=True)) if o >= lim)
        if drop:
            self._drop(sorted(drop))
        if recount:
            self.steps_left = min((lim - o for lim, o in zip(self.limit, self.out, strict=True)), default=0)
        self.starts = [i for i, s in enumerate(self.slot) if s < 0]

    def pages_needed(self) -> int:
        """Pages this step's decodes allocate: where a position starts a page not yet held."""
        ps, reqs, pos = self.page_size, self.reqs, self.pos
        return sum(pos[i] >= len(reqs[i].pages) * ps for i in self.starts)

    def plan(self, pool: KVAllocator) -> tuple[DecodeBlock, list[tuple[Req, BaseException | None]]]:
        """This step's block, advancing every member by one token, and the members whose page
        allocation failed (they leave the batch and sit this step out: None, no page; or the
        allocator's exception). Follows ``settle`` in the same step, and ``pages_needed``
        pages must be free (the planner checked)."""
        ps = self.page_size
        failed: list[tuple[Req, BaseException | None]] = []
        slot = self.slot
        for i in self.starts:
            r, p = self.reqs[i], self.pos[i]
            pages = r.pages
            if p == len(pages) * ps:
                try:
                    got = pool.pages.alloc(1)
                except Exception as exc:
                    failed.append((r, exc))
                    continue
                if got is None:
                    failed.append((r, None))
                    continue
                pages.extend(got)
            slot[i] = pages[p // ps] * ps
        if failed:
            self._drop(sorted(self.reqs.index(r) for r, _ in failed))
        block = DecodeBlock(self.reqs, self.rows, self.gens, self.pos, self.slot, self.out, self.greedy,
                            self.grammar_idx, self.grammars)  # fmt: skip
        # The next step's columns: new lists (the block keeps these); a slot past a page's end
        # is -1, found when that step is planned.
        self.pos = [p + 1 for p in self.pos]
        self.slot = [s + 1 if (p + 1) % ps else -1 for s, p in zip(self.slot, block.positions)]
        self.out = [o + 1 for o in self.out]
        self.steps_left -= 1
        for r in self.reqs:
            r.num_computed += 1
            r.num_launched_outputs += 1
        return block, failed


class Decoders:
    """Who decodes next: the plain requests as a :class:`DecodeBatch`, the others (``loose``)
    one by one, and ``joining``, the requests whose last prefill chunk was just planned."""

    def __init__(self, page_size: int, constrained: bool = True) -> None:
        self.page_size = page_size
        self.constrained = constrained  # whether constrained requests may join (their steps split)
        self.batch: DecodeBatch | None = None  # None: rebuilt from the running requests
        self.loose: list[Req] = []
        self.joining: list[Req] = []

    def reset(self) -> None:
        """The planner planned everyone one by one (or retracted): rebuild at the next step."""
        self.batch = None
        self.joining.clear()

    def ended(self, req: Req) -> None:
        """``req`` ended (the committer's finish, an abort): it leaves the batch."""
        if self.batch is not None:
            self.batch.leaving.append(req)

    def current(self, running: list[Req]) -> tuple[DecodeBatch, list[Req]]:
        """The batch, settled for this step (members that ended left it, new decoders joined),
        and the live decoders outside it (whether each decodes this step is the planner's call)."""
        batch = self.batch
        if batch is None:
            batch = self.batch = DecodeBatch(self.page_size)
            self.joining.clear()
            self.loose = []
            self._join(batch, [r for r in running if r.row is not None and r.num_computed >= len(r.fill_ids)])
        elif self.joining:
            joining = [r for r in self.joining if r.row is not None]
            self.joining.clear()
            self._join(batch, joining)
        batch.settle()
        if self.loose:
            self.loose = [r for r in self.loose if r.row is not None and r.finish_reason is None]
        return batch, self.loose

    def _join(self, batch: DecodeBatch, reqs: list[Req]) -> None:
        plain: list[Req] = []
        for r in reqs:
            if r.finish_reason is None and not r.abort_requested:
                joins = is_plain(r) and (self.constrained or r.grammar is None)
                (plain if joins else self.loose).append(r)
        if plain:
            batch.join(plain)

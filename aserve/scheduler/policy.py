"""Who runs next: plain Python over plain data, no device, no event loop.

``Scheduler.schedule()`` builds the next step from committed state plus the planned state of
steps still in flight (``Req.num_computed``, ``Req.num_launched_outputs``). Decodes go first,
then continuing chunked prefills, then new requests in arrival order (FCFS), all under one
token budget per step.

What it is configured with and what it returns (``SchedulerConfig``, ``Plan``, ``Blocked``)
are in :mod:`aserve.scheduler.plan`; the longest-prefix-match queue order
(``schedule_policy="lpm"``) is in :mod:`aserve.scheduler.lpm`.
"""

from __future__ import annotations

from collections import deque

from aserve.kv.allocator import KVAllocator
from aserve.scheduler.decode_batch import DecodeBlock, Decoders
from aserve.scheduler.lpm import count_skips, order_waiting
from aserve.scheduler.plan import Blocked, Plan, SchedulerConfig
from aserve.scheduler.prefix import PrefixCache
from aserve.scheduler.req import Req
from aserve.scheduler.seq import SeqPlan

__all__ = ["Scheduler"]


# Prefill tokens per step of a request that wants prompt logprobs: each one's logits row
# ([vocab] float32, 1 MiB for Gemma 3's 262k vocabulary) lives until the step ends.
PROMPT_LOGPROBS_CHUNK = 128


class Scheduler:
    def __init__(self, pool: KVAllocator, config: SchedulerConfig) -> None:
        self.pool = pool
        self.config = config
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self._admitted = 0
        self.num_retractions = 0
        # Requests that cannot fit the pool even alone; the engine ends them with KVCapacityError.
        self.stuck: list[Req] = []
        # Requests whose KV allocation raised while planning (the cause), or that the pool had
        # no room for with nothing else running (None); the engine ends them with KVAllocationError.
        self.failed: list[tuple[Req, BaseException | None]] = []
        self.prefix = PrefixCache(pool, config.radix_cache, config.debug)
        self.prefill_tokens_computed = 0
        # The plain ones as columns, the others one by one.
        self.decoders = Decoders(pool.page_size, config.constrained_lookahead)

    # -- intake and release -------------------------------------------------

    def add(self, req: Req) -> None:
        req.fill_ids = list(req.prompt_ids)
        self.waiting.append(req)

    def release_if_done(self, req: Req) -> bool:
        """Free a finished or aborted request's KV and row once no step in flight reads them.

        This is the safe point: the last step that touched the request has been committed
        (so the device finished reading and writing its slots) and the commit settled its
        ownership. KV goes back by *allocated* length, overshoot included.
        """
        if req.resources_freed or req.inflight > 0:
            return False
        if not (req.finished or req.abort_requested):
            return False
        self._free(req)
        return True

    def note_ended(self, req: Req) -> None:
        """``req`` ended (the committer's finish, an abort): it decodes no more."""
        self.decoders.ended(req)

    def _free(self, req: Req, publish: bool = True) -> None:
        if req.row is not None:
            self.prefix.release(req, publish=publish)
            self.pool.rows.free(req.row)
            req.row = None
        req.resources_freed = True
        if req in self.running:
            self.running.remove(req)

    def release_all(self) -> None:
        """Engine shutdown, after the device stopped: return everything still held."""
        self.decoders.reset()
        for req in list(self.running):
            req.inflight = 0
            if not req.resources_freed:
                self._free(req, publish=False)
        for req in self.waiting:
            req.resources_freed = True
        self.waiting.clear()
        self.prefix.flush()

    def remove_waiting(self, req: Req) -> bool:
        try:
            self.waiting.remove(req)
        except ValueError:
            return False
        req.resources_freed = True
        return True

    # -- planning -------------------------------------------------------------

    def schedule(self, pipeline_busy: bool) -> Plan | Blocked:
        budget = self.config.max_num_batched_tokens
        block: DecodeBlock | None = None
        # A token budget below the batch size could not hold every decode: no batch then (it
        # would be rebuilt and dropped every step), the general path alone.
        steady = budget >= self.config.max_running_requests
        if steady:
            batch, loose = self.decoders.current(self.running)
            loose = self._eligible(loose)
            need = batch.pages_needed() + self._decode_pages(loose)
            steady = len(batch) + len(loose) <= budget and self._room_for(need)
        if steady:
            # The steady state: the batch's columns advance in place, the others one by one.
            if len(batch):
                block, failed = batch.plan(self.pool)
                for r, exc in failed:  # no page (None): it sits this step out, one by one from now
                    (self.decoders.loose.append(r) if exc is None else self.failed.append((r, exc)))
                if not len(block):
                    block = None  # every member's page failed: no block (nor an empty step)
                elif self.config.debug:
                    block.check(self.pool.page_size, self.pool.max_context, self.config.max_lookahead)
            seqs = [seq for r in loose if (seq := self._plan_decode(r)) is not None]
        else:
            decodes = self._eligible(self.running)[:budget]
            if not self._room_for(self._decode_pages(decodes)):  # cached, unused prefixes go before anyone is retracted
                if pipeline_busy:
                    return Blocked.DRAIN
                decodes = self._retract_until_fits(decodes)
            # The general path plans everyone one by one; the batch is rebuilt at the next plan.
            self.decoders.reset()
            # A decode whose page allocation failed sits this step out (None).
            seqs = [seq for r in decodes if (seq := self._plan_decode(r)) is not None]
        num_decodes = len(seqs) + (0 if block is None else len(block))
        budget -= num_decodes
        chunk_tokens = 0

        # Chunked prefills already under way, oldest first, then new admissions (FCFS). When
        # every running request decodes this step, there is none (no loop over the batch).
        for r in self.running if num_decodes < len(self.running) else ():
            if budget <= 0:
                break
            if r.prefill_done or r.abort_requested or r.finished:
                continue
            chunk = self._plan_prefill_chunk(r, budget, reserve_pages=0)
            if chunk is None:
                if self._failed_last(r):
                    continue
                break
            seqs.append(chunk)
            budget -= chunk.extend_len
            chunk_tokens += chunk.extend_len
        order_before = None
        if (ordered := order_waiting(self.waiting, self.prefix, self.config)) is not None:
            self.waiting, order_before = ordered
        while self.waiting and budget > 0 and len(self.running) < self.config.max_running_requests:
            req = self.waiting[0]
            if self.pool.rows.num_free == 0:
                break
            # Keep a page per running request in reserve so admission does not force an
            # immediate retraction of someone already decoding.
            chunk = self._admit(req, budget, reserve_pages=len(self.running))
            if chunk is None:
                if self._failed_last(req):
                    self.waiting.popleft()
                    continue
                break
            self.waiting.popleft()
            seqs.append(chunk)
            budget -= chunk.extend_len
            chunk_tokens += chunk.extend_len
        if order_before is not None:
            count_skips(order_before)
        if not seqs and block is None:
            if not pipeline_busy and self._unstick():
                return self.schedule(pipeline_busy)
            return Blocked.IDLE
        return Plan(seqs, num_decodes, num_decodes + chunk_tokens, block)

    def _eligible(self, reqs: list[Req]) -> list[Req]:
        """Those of ``reqs`` that decode this step.

        The hot loop of the general path, once per request, with Req's properties inlined:
        prefill done, not finished, not ending by length once more is launched. A request
        with penalties reads its outputs so far, and the launch path stands in for one
        uncommitted output (the FutureMap's), not two: at depth 3 it waits for a commit.
        A structured request's mask is computed on the host from its committed tokens: with
        ``constrained_lookahead`` its step is split (the forward now, the sampler once the
        steps before it are committed), else it waits for every launched token's commit (a
        look-ahead of zero)."""
        lookahead = self.config.constrained_lookahead
        return [
            r
            for r in reqs
            if r.num_computed >= len(r.fill_ids)
            and r.finish_reason is None
            and not r.abort_requested
            and not r.length_reached(r.num_launched_outputs)
            and (r.num_launched_outputs - len(r.output_ids) <= 1 or not r.params.has_penalty)
            and (r.grammar is None or lookahead or r.num_launched_outputs == len(r.output_ids))
        ]

    def _unstick(self) -> bool:
        """Nothing could be planned and nothing is in flight: make progress possible.

        Running requests that can neither decode nor continue their prefill (the pool is
        full of running requests' KV) would otherwise wait forever. Retract the newest; a
        lone request that still cannot fit is ended by the engine (``stuck``).
        Returns True when it changed something worth planning again for.
        """
        live = [r for r in self.running if not r.resources_freed and not r.finished and not r.abort_requested]
        if not live and self.waiting:
            # Nothing runs or is in flight, so the whole pool is free or evictable, yet the
            # head of the queue got no KV: the allocator disagrees with its own count. End
            # it rather than wait for a commit that will never come.
            self.failed.append((self.waiting.popleft(), None))
            return False
        blocked = [r for r in live if not (r.prefill_done and r.length_reached(r.num_launched_outputs))]
        if not blocked:
            return False
        if len(live) > 1:
            self._retract(max(live, key=lambda r: r.admitted_seq))
            return True
        self.stuck.append(blocked[0])
        return False

    def _failed_last(self, req: Req) -> bool:
        """Whether ``req``'s KV allocation just failed (it ends; planning goes on without it)."""
        return bool(self.failed) and self.failed[-1][0] is req

    def _plan_decode(self, r: Req) -> SeqPlan | None:
        # Once per running request every step: KVAllocator.grow inlined for one token,
        # positional SeqPlan arguments.
        row = r.row
        assert row is not None
        pos, pages, ps = r.num_computed, r.pages, self.pool.page_size
        if pos == len(pages) * ps:
            # The page was counted before planning decodes; if the allocator still says no,
            # the request sits this step out, and if it raises, the request fails.
            try:
                got = self.pool.pages.alloc(1)
            except Exception as exc:
                self.failed.append((r, exc))
                return None
            if got is None:
                return None
            pages.extend(got)
        out = r.num_launched_outputs
        lookahead = out - len(r.output_ids)
        if self.config.debug:
            assert pos < self.pool.max_context and pos <= len(pages) * ps, (r.rid, pos, len(pages))
            assert lookahead <= self.config.max_lookahead, f"look-ahead {lookahead} for {r.rid}"
        plan = SeqPlan(r, row, r.generation, pos, 1, [pages[pos // ps] * ps + pos % ps], None, True, out, lookahead > 0)
        r.num_computed = pos + 1
        r.num_launched_outputs = out + 1
        return plan

    def _admit(self, req: Req, budget: int, reserve_pages: int) -> SeqPlan | None:
        row = self.pool.rows.alloc()
        assert row is not None
        req.row = row
        req.generation = self.pool.rows.generation[row]
        prefix_slots = self.prefix.match_on_admit(req)
        chunk = self._plan_prefill_chunk(req, budget, reserve_pages)
        if chunk is None:
            self.prefix.release(req, publish=False)
            req.num_computed = 0
            self.pool.rows.free(row)
            req.row = None
            return None
        chunk.prefix_slots = prefix_slots
        if req.num_retractions == 0:
            req.cached_prompt_tokens = len(prefix_slots)
        self.prefix.hit_tokens += len(prefix_slots)
        self.prefix.queried_tokens += len(req.fill_ids)
        req.admitted_seq = self._admitted
        self._admitted += 1
        self.running.append(req)
        return chunk

    def _plan_prefill_chunk(self, r: Req, budget: int, reserve_pages: int) -> SeqPlan | None:
        assert r.row is not None
        start = r.num_computed
        n = min(len(r.fill_ids) - start, budget)
        if r.wants_prompt_logprobs:
            n = min(n, PROMPT_LOGPROBS_CHUNK)
        need = self.pool.pages_needed(len(r.pages), start + n)
        if not self._room_for(need + reserve_pages):
            # Shrink the chunk to what fits (chunked prefill makes progress anyway).
            fit_pages = self.pool.pages.num_free - reserve_pages
            if fit_pages <= 0 and self.pool.pages_needed(len(r.pages), start + 1) > 0:
                return None
            cap = (len(r.pages) + max(fit_pages, 0)) * self.pool.page_size - start
            n = min(n, cap)
            if n <= 0:
                return None
        try:
            slots = self.pool.grow(r.pages, start, start + n)
        except Exception as exc:  # the allocator raised: this request fails, the step goes on
            self.failed.append((r, exc))
            return None
        if slots is None:  # counted as free above, yet refused: the request waits for a later step
            return None
        # The last chunk samples the first output, unless the request wants none
        # (max_tokens 0: it ends at this chunk's commit, with only its prompt logprobs).
        samples = start + n == len(r.fill_ids) and not r.length_reached(r.num_launched_outputs)
        plan = SeqPlan(
            req=r,
            row=r.row,
            generation=r.generation,
            prefix_len=start,
            extend_len=n,
            slots=slots,
            input_ids=r.fill_ids[start : start + n],
            samples=samples,
            output_index=r.num_launched_outputs,
            pending_output=False,
        )
        r.num_computed += n
        self.prefill_tokens_computed += n
        if samples:
            r.num_launched_outputs += 1
            self.decoders.joining.append(r)  # it decodes from the next step on
        return plan

    def _retract_until_fits(self, decodes: list[Req]) -> list[Req]:
        """Pipeline is empty here: send the newest requests back to the queue until KV fits."""

        victims = sorted(
            (r for r in self.running if not r.resources_freed and not r.finished),
            key=lambda r: r.admitted_seq,
        )
        # A victim's committed KV is published to the prefix cache, not freed: each check
        # evicts unlocked cached pages first, or the loop would retract everyone.
        while not self._room_for(self._decode_pages(decodes)) and victims:
            victim = victims.pop()
            if len(victims) == 0 and victim in decodes and len(decodes) == 1:
                # Alone and still out of memory: the pool cannot hold this request's context.
                break
            self._retract(victim)
            decodes = [r for r in decodes if r is not victim]
        fits = [r for r in decodes if self._room_for(self._decode_pages([r]))]
        self.stuck.extend(r for r in decodes if r not in fits)
        return fits

    def _decode_pages(self, decodes: list[Req]) -> int:
        """Pages one more decode token of each of ``decodes`` takes: one where the last
        page is full (``_plan_decode`` allocates exactly these)."""
        ps = self.pool.page_size
        return sum(1 for r in decodes if r.num_computed >= len(r.pages) * ps)

    def _room_for(self, pages: int) -> bool:
        """Whether ``pages`` can be allocated now, evicting unlocked cached prefixes if needed."""
        if pages > self.pool.pages.num_free:
            self.prefix.make_room(pages)
        return pages <= self.pool.pages.num_free

    def _retract(self, req: Req) -> None:
        assert req.inflight == 0, f"retracting {req.rid} while a step still reads it"
        assert req.row is not None
        # The pipeline is drained: everything computed is committed and may be published,
        # so the recompute after re-admission hits the cache.
        self.prefix.release(req, publish=True)
        self.pool.rows.free(req.row)
        req.row = None
        self.decoders.reset()
        self.running.remove(req)
        req.fill_ids = req.prompt_ids + req.output_ids
        req.num_computed = 0
        req.num_launched_outputs = len(req.output_ids)
        req.num_retractions += 1
        self.num_retractions += 1
        self.waiting.appendleft(req)

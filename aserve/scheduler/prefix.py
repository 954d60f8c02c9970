"""Prefix reuse glue between the scheduler and the radix tree.

Rules (each is a safe point, see docs/architecture.md):
* match at admission; the request locks the deepest matched node and points its row at the
  tree's pages (no copy);
* publish only committed KV: a finished/aborted request's at its release (its last step is
  committed), a chunked prefill's completed chunks at the commit of the step that wrote
  them, a retracted request's with the pipeline drained;
* a page is either the tree's (freed only by eviction of an unlocked leaf) or one request's
  (freed at that request's release); duplicates from concurrent identical prefixes stay
  private and are freed with their request;
* evict only unlocked leaves: no running request, so no step in flight, reads them.
"""

from __future__ import annotations

from collections import Counter

from aserve.kv.allocator import KVAllocator
from aserve.kv.radix import RadixCache
from aserve.scheduler.req import Req


class PrefixCache:
    def __init__(self, pool: KVAllocator, enabled: bool, debug: bool = False) -> None:
        self.pool = pool
        self.enabled = enabled
        # Debug mode: pages read / written by steps in flight, to prove that nothing in
        # flight is evicted and nothing being written is published.
        self.debug = debug
        self.inflight_read: Counter[int] = Counter()
        self.inflight_written: Counter[int] = Counter()
        self.tree = RadixCache(pool.page_size)
        self._owned: set[int] = set()  # pages owned by the tree
        self.hit_tokens = 0
        self.queried_tokens = 0

    @property
    def num_cached_pages(self) -> int:
        return len(self._owned)

    def match_on_admit(self, req: Req) -> list[int]:
        """Point a newly admitted request at its cached prefix; returns the matched slots."""
        if not self.enabled or req.wants_prompt_logprobs:
            return []  # (vLLM skips the cache for prompt logprobs too)
        # The last prompt token is always computed: its logits give the first output.
        probe = req.fill_ids[: len(req.fill_ids) - 1]
        m = self.tree.match(probe)
        if m.num_pages == 0:
            return []
        self.tree.lock(m.node)
        req.cache_node = m.node
        req.pages = list(m.pages)
        req.num_computed = m.num_pages * self.pool.page_size
        return [p * self.pool.page_size + i for p in m.pages for i in range(self.pool.page_size)]

    def publish(self, req: Req, kv_end: int) -> None:
        """Insert the first ``kv_end`` tokens' committed KV (page-aligned) and keep it locked."""
        if not self.enabled or req.row is None:
            return
        ps = self.pool.page_size
        tokens = req.prompt_ids + req.output_ids
        kv_end = min(kv_end, len(tokens))
        n = kv_end // ps
        if n == 0:
            return
        if self.debug:
            busy = [p for p in req.pages[:n] if self.inflight_written[p] > 0]
            assert not busy, f"{req.rid}: publishing pages {busy} that a step in flight still writes"
        node, dups = self.tree.insert(tokens[: n * ps], req.pages[:n])
        dup = set(dups)
        self._owned.update(p for p in req.pages[:n] if p not in dup)
        self.tree.lock(node)
        if req.cache_node is not None:
            self.tree.unlock(req.cache_node)
        req.cache_node = node

    def release(self, req: Req, publish: bool) -> None:
        """Return a request's private pages (after publishing its committed KV)."""
        if publish:
            self.publish(req, req.num_computed)
        if req.cache_node is not None:
            self.tree.unlock(req.cache_node)
            req.cache_node = None
        private = [p for p in req.pages if p not in self._owned]
        self.pool.pages.free(private)
        req.pages.clear()

    def make_room(self, pages: int) -> int:
        """Evict unlocked cached pages until ``pages`` are free; returns how many were freed."""
        short = pages - self.pool.pages.num_free
        if short <= 0 or not self.enabled:
            return 0
        freed = self.tree.evict(short)
        if self.debug:
            busy = [p for p in freed if self.inflight_read[p] > 0]
            assert not busy, f"evicting pages {busy} that a step in flight reads"
        self._owned.difference_update(freed)
        self.pool.pages.free(freed)
        return len(freed)

    def flush(self) -> int:
        freed = self.tree.flush()
        self._owned.difference_update(freed)
        self.pool.pages.free(freed)
        return len(freed)

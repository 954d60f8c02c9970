"""The longest-prefix-match order of the waiting queue (``schedule_policy="lpm"``).

When at least ``lpm_min_queue`` requests wait, the one with the longest cached prefix is
admitted first, so requests that share a prefix run while it is cached; a request passed
over ``lpm_max_skips`` times goes first (no starvation). Plain functions over the queue, the
prefix cache and the config: :class:`~aserve.scheduler.policy.Scheduler` orders its queue
with them before admitting, and counts who was passed over after.
"""

from __future__ import annotations

from collections import deque

from aserve.scheduler.plan import SchedulerConfig
from aserve.scheduler.prefix import PrefixCache
from aserve.scheduler.req import Req

__all__ = ["count_skips", "order_waiting"]


def order_waiting(
    waiting: deque[Req], prefix: PrefixCache, cfg: SchedulerConfig
) -> tuple[deque[Req], list[Req]] | None:
    """Longest-prefix-match order (policy "lpm"): the reordered queue and the arrival order
    it replaced; None where the policy is off or the queue is short (the order stays)."""
    if cfg.schedule_policy != "lpm" or not prefix.enabled or len(waiting) < cfg.lpm_min_queue:
        return None
    before = list(waiting)
    rank = {id(r): i for i, r in enumerate(before)}
    tree = prefix.tree

    def key(r: Req) -> tuple[int, int, int]:
        starved = r.lpm_skips >= cfg.lpm_max_skips
        return (0 if starved else 1, 0 if starved else -tree.match_len(r.fill_ids), rank[id(r)])

    return deque(sorted(before, key=key)), before


def count_skips(before: list[Req]) -> None:
    """A waiting request was skipped when someone who arrived after it was admitted."""
    admitted = [i for i, r in enumerate(before) if r.row is not None]
    if not admitted:
        return
    latest = max(admitted)
    for r in before[:latest]:
        if r.row is None and not r.finished:
            r.lpm_skips += 1

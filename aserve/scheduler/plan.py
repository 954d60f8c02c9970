"""What the scheduler is given and what it gives back: its configuration
(:class:`SchedulerConfig`), the next step's sequences (:class:`Plan`, each one a
:class:`~aserve.scheduler.seq.SeqPlan`, the plain decodes a
:class:`~aserve.scheduler.decode_batch.DecodeBlock`), or why there is none (:class:`Blocked`).

Plain data, no device, no event loop: the engine builds the config, ``Scheduler.schedule()``
returns the plan, the device launches it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from aserve.scheduler.decode_batch import DecodeBlock
from aserve.scheduler.req import Req
from aserve.scheduler.seq import SeqPlan

__all__ = ["Blocked", "Plan", "SchedulerConfig"]

if TYPE_CHECKING:
    from aserve.config import EngineConfig


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_running_requests: int = 64
    max_waiting_requests: int = 4096
    radix_cache: bool = True
    debug: bool = False
    # "fcfs": arrival order. "lpm": longest cached prefix first when the queue is long, so
    # requests that share a prefix run while it is cached; a request passed over
    # ``lpm_max_skips`` times goes first (no starvation).
    schedule_policy: str = "fcfs"
    lpm_min_queue: int = 4
    lpm_max_skips: int = 8
    # Outputs a request may have launched but not committed (pipeline depth - 1).
    max_lookahead: int = 1
    # Constrained (structured-output) requests too: their steps split their launch, the sampler
    # waiting for the commits its masks need. False: they wait for every commit instead (a
    # look-ahead of zero; ASERVE_SPLIT_MASKS=0, kept to measure one against the other).
    constrained_lookahead: bool = True

    @classmethod
    def from_engine(cls, cfg: EngineConfig) -> SchedulerConfig:
        assert cfg.max_num_batched_tokens is not None and cfg.max_running_requests is not None, (
            "the engine resolves the batch sizes at load"
        )
        return cls(
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_running_requests=cfg.max_running_requests,
            max_waiting_requests=cfg.max_waiting_requests,
            radix_cache=cfg.radix_cache,
            debug=cfg.debug,
            schedule_policy=cfg.schedule_policy,
            max_lookahead=cfg.pipeline_depth - 1,
            constrained_lookahead=os.environ.get("ASERVE_SPLIT_MASKS", "1") != "0",
        )


class Plan:
    """The next step's sequences: decodes first, then prefill chunks.

    ``block``: the plain decodes as columns (:class:`DecodeBlock`), leading the step;
    ``extra``: the other sequences (decodes outside the batch, then prefill chunks) as
    ``SeqPlan``\\ s. ``seqs`` is every sequence as a ``SeqPlan`` (built from the block on first
    use, for debug checks and tests)."""

    __slots__ = ("_seqs", "block", "extra", "num_decodes", "num_tokens")

    def __init__(
        self, seqs: list[SeqPlan], num_decodes: int | None = None, num_tokens: int | None = None,
        block: DecodeBlock | None = None,
    ) -> None:  # fmt: skip
        """``num_decodes`` / ``num_tokens``: counted here unless the planner, which knows
        them (the decodes lead, one token each), passes them."""
        self.block = block
        self.extra = seqs
        self._seqs = seqs if block is None else None
        nb = 0 if block is None else len(block)
        self.num_decodes = nb + sum(1 for s in seqs if s.input_ids is None) if num_decodes is None else num_decodes
        self.num_tokens = nb + sum(s.extend_len for s in seqs) if num_tokens is None else num_tokens

    @property
    def seqs(self) -> list[SeqPlan]:
        if self._seqs is None:
            assert self.block is not None
            self._seqs = self.block.seq_plans() + self.extra
        return self._seqs

    def reqs(self) -> list[Req]:
        """Every sequence's request, in launch order."""
        extra = [s.req for s in self.extra]
        return extra if self.block is None else self.block.reqs + extra


class Blocked(Enum):
    """Why ``schedule`` returned no plan."""

    IDLE = "idle"  # nothing runnable
    DRAIN = "drain"  # KV is short: commit everything in flight, then plan again

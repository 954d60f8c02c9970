"""One sequence's part of a step: what the planner decided for it, and the committer's snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aserve.scheduler.req import Req


@dataclass(slots=True)
class SeqPlan:
    """One sequence's part of a step. Built fresh every step and never changed after launch,
    so it is also the step's snapshot of the sequence that the committer reads."""

    req: Req
    row: int
    generation: int
    prefix_len: int
    extend_len: int
    slots: list[int]
    input_ids: list[int] | None  # host tokens for a prefill chunk; None: decode input from the FutureMap
    samples: bool  # the sampled token is an output (last prefill chunk, or a decode)
    output_index: int  # index of the output token this step samples (seeded sampling step)
    pending_output: bool  # the decode input is an output not yet committed (overlap look-ahead)
    prefix_slots: Sequence[int] = ()  # cached prefix slots for positions [0, len)

    @property
    def kv_end(self) -> int:
        """Positions [0, kv_end) hold KV once this step is committed."""
        return self.prefix_len + self.extend_len

"""A launched step and the four states of its tokens.

Every token the engine produces passes through four states (the seed's vocabulary), and a
``Step`` carries one awaitable per state, each resolved exactly once and in this order:

* ``planned``: the batch is chosen, its KV slots allocated, its inputs built; nothing runs.
* ``in_flight``: forward and sampling are queued on the device (``host_time``: when the
  launch began); the CPU cannot read the results.
* ``materialized``: the device wrote the sampled tokens into the FutureMap; the next step
  may consume them on the device (their values are not on the host yet).
* ``committed``: the device-to-host copy landed (``copied``) and the committer appended the
  tokens to their requests, checked stops, settled KV and fed the output cells.

Any coroutine may ``await step.<state>.wait()`` (``Engine.watch_steps`` hands steps out as
they launch). At shutdown the states a step will never reach are cancelled: their waiters
get :class:`aserve.errors.EngineClosedError` instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aserve.device.events import DeviceEvent, HostMark
from aserve.scheduler.decode_batch import DecodeBlock
from aserve.scheduler.req import Req
from aserve.scheduler.seq import SeqPlan

if TYPE_CHECKING:
    from aserve.sampling.masks import FillRunner
    from aserve.scheduler.plan import Plan


@dataclass
class StepOutputs:
    """The sampled tokens on the host, in launch order (one per entry)."""

    token_ids: list[int]
    logprobs: list[float] | None = None
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None
    # Prompt logprobs, rows in the order of ``Step.prompt_spans``.
    prompt_logprobs: list[float] | None = None
    prompt_top_ids: list[list[int]] | None = None
    prompt_top_logprobs: list[list[float]] | None = None


# The fields of a sampler's output (``SampleOutput``) that come back to the host, as
# StepOutputs names them.
OUTPUT_NAMES = ("token_ids", "logprobs", "top_ids", "top_logprobs", "prompt_logprobs", "prompt_top_ids",
                "prompt_top_logprobs")  # fmt: skip


@dataclass(eq=False)
class Step:
    index: int
    # The plan's sequences, in launch order: the committer's snapshot of what was launched.
    # With a ``block`` (the plain decodes as columns), they lead and ``entries`` follow.
    entries: list[SeqPlan]
    num_tokens: int
    num_decodes: int
    forward_begin: DeviceEvent  # the device started the step (device timing)
    materialized: DeviceEvent
    copied: DeviceEvent  # the results are readable on the host (the committer's gate)
    launch_time: float  # host clock when launch began
    planned: HostMark = field(default_factory=lambda: HostMark("planned"))
    in_flight: HostMark = field(default_factory=lambda: HostMark("in_flight"))
    committed: HostMark = field(default_factory=lambda: HostMark("committed"))
    plan_s: float = 0.0
    launch_s: float = 0.0  # building its inputs (``prepare_s``, with the plan) included
    prepare_s: float = 0.0
    outputs: StepOutputs | None = None
    depth_in_use: int = 0  # pipeline slots held when it was launched
    after_idle: bool = True  # the device had nothing queued before it (no idle gap to report)
    debug_pages: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))  # (read, written), debug
    # Device tensors and host buffers that must outlive the device's use of them.
    keepalive: list[Any] = field(default_factory=list)
    read_host: Callable[[], StepOutputs] | None = None
    # A split launch (constrained rows whose masks wait for earlier steps' commits): fills the
    # masks (their GIL-free part through the FillRunner given, if any), launches the sampler and
    # the copy out, resolving ``materialized`` and ``copied``; None once done.
    finish_launch: Callable[[FillRunner | None], None] | None = None
    # A split step's (forward ended, sampler began): the device idles between them while the
    # host commits the steps before and fills the masks; the recorder counts it as a gap.
    split_gap: tuple[DeviceEvent, DeviceEvent] | None = None
    # (entry, first prompt position, rows) of the prompt logprobs the step computed.
    prompt_spans: list[tuple[int, int, int]] = field(default_factory=list)
    # (entry, GrammarState) of the rows a grammar constrains: the commit advances them.
    grammar_rows: list[tuple[int, Any]] = field(default_factory=list)
    block: DecodeBlock | None = None

    @classmethod
    def of(
        cls, index: int, plan: Plan, begin: DeviceEvent, materialized: DeviceEvent, copied: DeviceEvent,
        keepalive: list[Any],
    ) -> Step:  # fmt: skip
        """The handle of ``plan``'s launch; the plan's sequences are the snapshot the committer
        reads."""
        return cls(
            index=index,
            entries=plan.extra,
            block=plan.block,
            num_tokens=plan.num_tokens,
            num_decodes=plan.num_decodes,
            forward_begin=begin,
            materialized=materialized,
            copied=copied,
            launch_time=0.0,
            keepalive=keepalive,
        )

    @property
    def num_seqs(self) -> int:
        return len(self.entries) + (0 if self.block is None else len(self.block))

    def reqs(self) -> list[Req]:
        """Every sequence's request, in launch order."""
        extra = [e.req for e in self.entries]
        return extra if self.block is None else self.block.reqs + extra

    def read_outputs(self) -> StepOutputs:
        """Host copies of the sampled tokens; valid only once ``copied`` completed."""
        assert self.copied.done(), f"step {self.index} read before its copy event"
        if self.outputs is None:
            assert self.read_host is not None
            self.outputs = self.read_host()
        return self.outputs

    def cancel_unreached(self, error: BaseException) -> None:
        """Shutdown: every state not yet reached resolves with ``error`` for its waiters."""
        for state in (self.planned, self.in_flight, self.materialized, self.copied, self.committed):
            state.cancel(error)

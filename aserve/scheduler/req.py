"""A request as the scheduler sees it.

Two kinds of state live here, with different owners:

* **committed** (``output_ids``, ``finish_reason``, what the output cell was given): written
  only by the committer, at the commit point.
* **planned** (``num_computed``, ``num_launched_outputs``, ``pages``, ``inflight``): written
  by the planner when it puts the request into a step; it runs ahead of the committed state
  by at most the pipeline depth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aserve.outputs import FinishReason, TokenLogprob
from aserve.sampling_params import SamplingParams

if TYPE_CHECKING:  # the cell is the engine's (it wakes a coroutine); the policy never touches it
    from aserve.engine.cell import OutputCell


@dataclass(eq=False)
class Req:
    rid: str
    index: int  # which of the parent's n choices
    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int  # max_tokens clipped to the context and the pool, once, at admission
    seed: int
    stop_ids: frozenset[int]  # EOS (unless ignore_eos) + stop_token_ids
    arrival: float = field(default_factory=time.perf_counter)
    group_id: str = ""  # the caller's request id (rid has a ".i" suffix when n > 1)

    # -- committed --
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    # With params.prompt_logprobs: entry k is prompt token k's (None for k = 0), appended as
    # prefill chunks commit; complete when it is as long as the prompt.
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    cell: OutputCell | None = None  # where committed tokens go (set by the engine at admission)
    # A structured request's grammar (aserve.sampling.masks.GrammarState), advanced by the
    # committer; the planner keeps such a request at a look-ahead of zero.
    grammar: Any = None

    # -- planned --
    row: int | None = None
    generation: int = 0
    pages: list[int] = field(default_factory=list)
    fill_ids: list[int] = field(default_factory=list)  # prompt (+ committed output after a retraction)
    num_computed: int = 0  # tokens whose KV is written by launched steps
    num_launched_outputs: int = 0  # tokens sampled by launched steps (committed ones included)
    inflight: int = 0  # launched steps not yet committed that include this request
    admitted_seq: int = -1  # admission order; the newest is retracted first
    abort_requested: bool = False
    num_retractions: int = 0
    resources_freed: bool = False
    lpm_skips: int = 0  # times a later arrival was admitted first (longest-prefix-first policy)
    cache_node: Any = None  # deepest radix node this request holds locked (prefix cache)
    # Prompt tokens whose KV came from the prefix cache at the first admission (reported in
    # usage; a re-admission after retraction is the engine's business, not the client's).
    cached_prompt_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= len(self.fill_ids)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs asked for and not all committed yet: its prefill needs the logits
        of every prompt position, which a cached prefix does not have."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_ids)

    @property
    def lookahead(self) -> int:
        """Outputs launched but not committed: the distance the device runs ahead."""
        return self.num_launched_outputs - len(self.output_ids)

    def length_reached(self, num_outputs: int) -> bool:
        """The length limit: a request with ``num_outputs`` outputs is done by length. The
        planner asks it of launched outputs (do not launch one more), the committer of
        committed outputs (finish with ``"length"``). The decode batch and the committer's
        block path apply the same rule to ``max_new_tokens`` directly, as a column."""
        return num_outputs >= self.max_new_tokens

"""What the engine hands back: results and streamed deltas (plain data, no event loop)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob), most likely first


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (OpenAI's prompt_tokens_details)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class CompletionOutput:
    """One generated sequence (one of ``n``)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    # With ``SamplingParams.prompt_logprobs``: one per prompt token, None for the first.
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass
class CompletionResult:
    """The final result of a request; the single-choice fields read ``outputs[0]``."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    usage: Usage
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        return self.outputs[0].logprobs


@dataclass
class Delta:
    """New output of one sequence since the previous delta.

    ``text`` never splits a UTF-8 character and is never repeated; concatenating every
    delta's ``text`` (per ``index``) gives the final text. Once ``finish_reason`` is set this
    is the last delta of that sequence.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    # With ``SamplingParams.prompt_logprobs``, on a choice's first delta: one per prompt token,
    # None for the first (nothing precedes it).
    prompt_logprobs: list[TokenLogprob | None] | None = None

"""What the engine hands back: results, streamed deltas, and the per-request output cell."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from aserve.engine.pipeline import Signal

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


class OutputCell:
    """Latest undelivered output of one sequence; the committer never waits on it.

    The committer appends; the consumer takes everything at once. A slow reader therefore
    gets larger chunks instead of the scheduler buffering an unbounded queue of messages.
    """

    __slots__ = (
        "error",
        "finish_reason",
        "finished",
        "logprobs",
        "pushed",
        "signal",
        "stop_reason",
        "text_limit",
        "token_ids",
        "wake_every",
    )

    def __init__(self, signal: Signal | None = None, wake_every: int = 1) -> None:
        self.token_ids: list[int] = []
        self.pushed = 0  # tokens pushed in all
        self.logprobs: list[TokenLogprob] = []
        self.finished = False
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None
        self.error: BaseException | None = None
        # Where the final text ends (a stop string was found at this character offset).
        self.text_limit: int | None = None
        # Shared by the n sequences of one request: one consumer waits for any of them.
        self.signal = signal if signal is not None else Signal()
        # When a push wakes the consumer: 1, every token; N, the first token and then once N
        # tokens wait untaken (a stream's interval); 0, never (only finish() and fail() wake
        # it: ``complete`` wants the whole result).
        self.wake_every = wake_every

    def push(self, token_id: int, logprob: TokenLogprob | None) -> None:
        self.token_ids.append(token_id)
        self.pushed += 1
        if logprob is not None:
            self.logprobs.append(logprob)
        every = self.wake_every
        if every and (len(self.token_ids) >= every or self.pushed == 1):
            self.signal.set()

    def finish(self, reason: FinishReason, stop_reason: str | int | None = None) -> None:
        self.finished = True
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.signal.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.finished = True
        self.signal.set()

    def ready(self) -> bool:
        """Whether the consumer should take now: the end, the first tokens, or a full interval."""
        if self.finished:
            return True
        n, every = len(self.token_ids), self.wake_every
        return n > 0 and every > 0 and (n >= every or n == self.pushed)

    def take_nowait(self) -> tuple[list[int], list[TokenLogprob]]:
        """Everything not yet taken; never waits."""
        ids, lps = self.token_ids, self.logprobs
        if ids:
            self.token_ids, self.logprobs = [], []
        return ids, lps

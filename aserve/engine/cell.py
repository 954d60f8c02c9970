"""The per-sequence output cell: where the committer leaves tokens for the stream's consumer."""

from __future__ import annotations

from aserve.outputs import FinishReason, TokenLogprob
from aserve.sync import Signal


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
        "prompt_logprobs",
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
        # Set (whole) by the commit of the last prefill chunk, before its first token.
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
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

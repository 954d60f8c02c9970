"""One record per request: the single shape both targets produce and every metric reads.

Times are seconds on the run's own clock (``time.perf_counter()`` minus the run start), so
records from one run can be laid on one timeline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    index: int
    prompt_tokens: int  # what we built and sent (exact when sent as token ids)
    max_tokens: int  # what we asked for
    scheduled_s: float | None  # when the arrival schedule wanted it sent; None in closed loop
    warmup: bool = False
    ready_s: float | None = None  # when a concurrency slot was free (the earliest it could go)
    send_s: float | None = None  # just before the request left the client
    chunk_s: list[float] = field(default_factory=list)  # arrival of each chunk that carried tokens
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each of those chunks
    done_s: float | None = None  # the stream ended (``[DONE]``, or the engine's last delta)
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    count_source: str = "chunks"  # how chunk_tokens were counted: token_ids, logprobs, tokenizer, chunks
    status: int | None = None  # HTTP status; None for the in-process engine or when none came
    error_type: str | None = None  # HTTPStatus, IncompleteStream, ReadTimeout, ConnectError, ...
    error: str | None = None  # the first part of the message
    finished: bool = False  # the request came to an end, successfully or not

    @property
    def ok(self) -> bool:
        return self.finished and self.error_type is None

    @property
    def counted_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def output_tokens(self) -> int:
        # The server's usage is authoritative; chunk counting is the fallback and the cross-check.
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return self.counted_tokens

    @property
    def input_tokens(self) -> int:
        return self.usage_prompt_tokens if self.usage_prompt_tokens is not None else self.prompt_tokens

    @property
    def ttft(self) -> float | None:
        if self.send_s is None or not self.chunk_s:
            return None
        return self.chunk_s[0] - self.send_s

    @property
    def e2e(self) -> float | None:
        if self.send_s is None or self.done_s is None:
            return None
        return self.done_s - self.send_s

    @property
    def tpot(self) -> float | None:
        ttft, e2e, n = self.ttft, self.e2e, self.output_tokens
        if ttft is None or e2e is None or n < 2:
            return None
        return (e2e - ttft) / (n - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_s, self.chunk_s[1:])]

    @property
    def send_lag(self) -> float | None:
        """Actual send minus the earliest moment the request was allowed to go."""
        allowed = [x for x in (self.scheduled_s, self.ready_s) if x is not None]
        if self.send_s is None or not allowed:
            return None
        return self.send_s - max(allowed)

    def fail(self, error_type: str, message: str, now: float, status: int | None = None) -> None:
        self.error_type = error_type
        self.error = message[:300]
        self.status = status if status is not None else self.status
        self.done_s = now
        self.finished = True

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ok=self.ok, output_tokens=self.output_tokens, ttft=self.ttft, tpot=self.tpot, e2e=self.e2e)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})

"""The in-process target: an ``aserve.Engine`` in this event loop, same records as HTTP.

The engine's task group must be entered and left by one task, so the caller opens the engine
(``async with EngineTarget.open(...)``) in the task that also runs the whole load.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from loadgen.records import RequestRecord
from loadgen.server_view import from_engine_stats
from loadgen.workloads import TokenizerLike, WorkItem

Clock = Callable[[], float]


class EngineTarget:
    def __init__(self, engine: Any, *, ignore_eos: bool = True, request_timeout: float = 600.0) -> None:
        self.engine = engine
        self.ignore_eos = ignore_eos
        self.request_timeout = request_timeout

    @classmethod
    @asynccontextmanager
    async def open(cls, options: dict[str, Any], **kwargs: Any) -> AsyncIterator[EngineTarget]:
        import aserve  # imported late: torch and the model are heavy, and HTTP runs need neither

        async with aserve.Engine(**options) as engine:
            yield cls(engine, **kwargs)

    @property
    def model(self) -> str:
        return str(self.engine.config.model)

    @property
    def tokenizer(self) -> TokenizerLike:
        tok: TokenizerLike = self.engine.tokenizer
        return tok

    async def wait_ready(self, limit_s: float) -> None:
        return None  # entering the engine already waited for the model

    async def server_counters(self) -> dict[str, float] | None:
        return from_engine_stats(self.engine.stats())

    async def aclose(self) -> None:
        return None

    async def send(self, item: WorkItem, rec: RequestRecord, now: Clock) -> None:
        from aserve import SamplingParams

        prompt: Any = item.prompt_ids if item.prompt_ids is not None else item.prompt_text
        params = SamplingParams(max_tokens=item.max_tokens, temperature=0.0, ignore_eos=self.ignore_eos)
        rec.count_source = "token_ids"
        rec.usage_completion_tokens = 0
        try:
            with anyio.fail_after(self.request_timeout):
                rec.send_s = now()
                async for delta in self.engine.generate(prompt, params):
                    t = now()
                    if delta.token_ids:
                        rec.chunk_s.append(t)
                        rec.chunk_tokens.append(len(delta.token_ids))
                        rec.usage_completion_tokens += len(delta.token_ids)
                    if delta.finish_reason is not None:
                        if delta.finish_reason == "abort":
                            rec.fail("Aborted", "the engine aborted the request", t)
                            return
                        rec.done_s = t
                        rec.finished = True
            rec.usage_prompt_tokens = item.prompt_len or None
            if not rec.finished:
                rec.fail("IncompleteStream", "the engine's stream ended without a finish reason", now())
        except TimeoutError:
            rec.fail("Timeout", f"no end of stream after {self.request_timeout:g}s", now())
        except Exception as exc:  # an engine error is a failed request, not a failed run
            rec.fail(type(exc).__name__, str(exc), now())

"""Server-sent events: ``data: {json}\\n\\n`` chunks ending with ``data: [DONE]``, and a
``: keep-alive`` comment line whenever the stream has been silent for the keep-alive interval
(waiting in the queue, or between tokens), so proxies do not cut it; clients skip comments.

Cancellation is the abort path: when Starlette notices the client left it cancels the task
iterating the body, the engine's generator sees the cancellation at its await and aborts the
request (freeing its KV). :class:`SSEResponse` also closes both itself, because a client
that leaves before the body is first iterated would otherwise leave the (already submitted)
engine request running; ``RequestStream.aclose`` aborts it whether iteration began or not.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol

import anyio
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from aserve.errors import AserveError
from aserve.outputs import Delta, Usage
from aserve.server.errors import error_body
from aserve.server.metrics import RequestTimer

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"


def event(payload: BaseModel | dict[str, Any]) -> bytes:
    if isinstance(payload, BaseModel):
        data = payload.model_dump_json(exclude_unset=False)
    else:
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


class Closable(Protocol):
    async def aclose(self) -> None: ...


class DeltaStream(Protocol):
    """What ``stream_events`` reads: the engine's ``RequestStream``."""

    def __anext__(self) -> Awaitable[Delta]: ...

    async def wait_output(self, timeout_s: float) -> bool: ...


class ChunkMaker(Protocol):
    """Builds the endpoint-specific chunks (completion vs chat)."""

    def opening(self) -> list[BaseModel]: ...

    # None: nothing to send yet; bytes: the event already rendered (a common chunk's fast path).
    def delta(self, delta: Delta) -> BaseModel | bytes | None: ...

    def usage(self, usage: Usage) -> BaseModel: ...


async def stream_events(
    deltas: DeltaStream,
    maker: ChunkMaker,
    *,
    prompt_tokens: int,
    include_usage: bool,
    timer: RequestTimer,
    cached_tokens: Callable[[], int] = lambda: 0,
    keepalive_s: float = 5.0,
) -> AsyncGenerator[bytes, None]:
    completion_tokens = 0
    outcome = "abort"  # what remains if we are cancelled (the client left)
    try:
        for opening in maker.opening():
            yield event(opening)
        while True:
            while not await deltas.wait_output(keepalive_s):
                yield KEEPALIVE
            try:
                delta = await deltas.__anext__()
            except StopAsyncIteration:
                break
            if delta.finish_reason == "abort":
                # The engine ended the request under us: the server is shutting down.
                outcome = "shutdown"
                yield event(error_body(503, "the server is shutting down; request aborted", "request_aborted"))
                yield DONE
                return
            completion_tokens += len(delta.token_ids)
            timer.on_tokens(len(delta.token_ids), streamed=True)
            chunk = maker.delta(delta)
            if chunk is not None:
                yield chunk if isinstance(chunk, bytes) else event(chunk)
        if include_usage:
            yield event(maker.usage(Usage(prompt_tokens, completion_tokens, cached_tokens())))
        outcome = "success"
        yield DONE
    except AserveError as exc:
        # Headers are gone already; the only way left to report an error is in-band.
        outcome = "error"
        yield event(error_body(exc.status_code, str(exc), exc.error_type))
        yield DONE
    finally:
        timer.finish(outcome)


class SSEResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        engine_stream: Closable,
        on_close: Callable[[], None],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(body, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self._body = body
        self._engine_stream = engine_stream
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Shielded: we may be here because of a cancellation, and closing must still happen.
            with anyio.CancelScope(shield=True):
                await self._body.aclose()
                await self._engine_stream.aclose()
            self._on_close()

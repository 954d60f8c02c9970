"""The Starlette app: its lifespan owns the engine, a middleware gives every request an id.

The engine loads in a task of the lifespan's task group rather than in the startup hook, so
the listener is up while the model loads and ``/health`` can answer 503 until it is ready.
"""

from __future__ import annotations

import hmac
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import structlog
from starlette.applications import Starlette
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aserve.config import EngineConfig
from aserve.logs import get_logger
from aserve.server.errors import APIError, error_response, exception_handlers
from aserve.server.limits import DEFAULT_BODY_LIMITS, BodyLimits
from aserve.server.routes import read_body, routes
from aserve.server.state import ServerSettings, ServerState

log = get_logger("aserve.server")

_GENERATE_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


def _needs_key(path: str) -> bool:
    """Paths behind ``--api-key``: the API, the admin routes, and (un)tokenizing."""
    return path.startswith(("/v1/", "/admin/")) or path in ("/tokenize", "/detokenize")


async def _discard_body(scope: Scope, receive: Receive, limits: BodyLimits) -> bool:
    """Read and drop the body of a request answered without it (a 401), so that its keep-alive
    connection can carry the next request; False past the body's limits (``read_body``'s
    413 / 408) or when the client left (the connection is then closed after the answer).

    Answered with its body unread, the connection was closed by Hypercorn or not depending on
    whether the body had arrived yet, and a client that reused it at once met a disconnect
    instead of an answer to its next request (tests/server/test_server.py)."""
    try:
        await read_body(Request(scope, receive), limits)
    except (APIError, ClientDisconnect):
        return False
    return True


class RequestContext:
    """Request id, structured access log, Bearer auth for /v1, and request outcome counts."""

    def __init__(self, app: ASGIApp, settings: ServerSettings) -> None:
        self.app = app
        self.settings = settings
        # In a front-end process, its name (the core's name for it too): "fe-<pid>".
        self.front_end = f"fe-{os.getpid()}" if settings.core_address is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        path: str = scope["path"]
        status = 500
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                headers["X-Request-Id"] = rid
                if self.front_end is not None:  # which front-end process answered (api workers)
                    headers["X-Aserve-Front-End"] = self.front_end
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=rid):
            try:
                if _needs_key(path) and not self._authorized(Headers(scope=scope)):
                    resp = error_response(401, "invalid or missing API key", "authentication_error")
                    resp.headers["WWW-Authenticate"] = "Bearer"
                    if not await _discard_body(scope, receive, self.settings.body):
                        resp.headers["Connection"] = "close"  # the rest of the body is unread
                    await resp(scope, receive, send_with_id)
                else:
                    await self.app(scope, receive, send_with_id)
            finally:
                endpoint = _GENERATE_PATHS.get(path)
                server: ServerState | None = scope["state"].get("server")
                # 499 (client left) is counted by the route as outcome="abort".
                if endpoint is not None and status >= 400 and status != 499 and server is not None:
                    server.metrics.requests.labels(endpoint, f"http_{status}").inc()
                log.info(
                    "request",
                    method=scope["method"],
                    path=path,
                    status=status,
                    duration_ms=round((time.perf_counter() - start) * 1e3, 1),
                )

    def _authorized(self, headers: Headers) -> bool:
        key = self.settings.api_key
        if key is None:
            return True
        scheme, _, token = headers.get("authorization", "").partition(" ")
        # Compared as bytes in constant time, so timing does not leak how much of the key matched.
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def create_app(
    config: EngineConfig,
    *,
    api_key: str | None = None,
    served_model_name: str = "gemma-3-270m",
    body: BodyLimits = DEFAULT_BODY_LIMITS,
    core_address: str | None = None,
) -> Starlette:
    """The app; with ``core_address`` its engine is the engine core of another process
    (``aserve serve --api-workers N``), else an embedded ``Engine``."""
    from starlette.middleware import Middleware

    settings = ServerSettings(config, api_key, served_model_name, body, core_address)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        state = ServerState(settings)
        app.state.server = state  # serve.py reaches it here to drain on SIGTERM
        async with anyio.create_task_group() as tg:
            tg.start_soon(state.run_engine, name="aserve.server.engine")
            try:
                yield {"server": state}
            finally:
                state.stop.set()

    return Starlette(
        routes=routes(),
        middleware=[Middleware(RequestContext, settings=settings)],
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )

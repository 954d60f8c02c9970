"""The Starlette app: its lifespan owns the engine, a middleware gives every request an id.

The engine loads in a task of the lifespan's task group rather than in the startup hook, so
the listener is up while the model loads and ``/health`` can answer 503 until it is ready.
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from starlette.applications import Starlette
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aserve.config import EngineConfig
from aserve.engine import Engine
from aserve.logs import get_logger
from aserve.server.errors import RETRY_AFTER_S, APIError, error_response, exception_handlers
from aserve.server.metrics import ServerMetrics
from aserve.stats import EngineStats

log = get_logger("aserve.server")

_GENERATE_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


@dataclass(frozen=True)
class ServerSettings:
    config: EngineConfig
    api_key: str | None
    served_model_name: str
    max_body_bytes: int


class ServerState:
    """Everything one running app holds; built by the lifespan, reached via ``request.state.server``."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.engine: Engine | None = None
        self.ready = False
        self.draining = False
        self.active = 0  # admitted requests whose response has not finished
        self.load_error: BaseException | None = None
        self.stop = anyio.Event()  # tells the engine task to close the engine
        self.stopped = anyio.Event()  # the engine task has ended (closed, or failed to load)
        self._idle = anyio.Event()  # replaced each time someone waits for active to reach 0
        self.metrics = ServerMetrics(self._stats)

    def _stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    def model_names(self) -> set[str]:
        return {self.settings.served_model_name, self.settings.config.model}

    def admit(self) -> Engine:
        """The engine for a new request, or a 503 telling the client to come back."""
        retry = {"Retry-After": RETRY_AFTER_S}
        if self.draining:
            raise APIError(503, "the server is shutting down", "engine_closed", headers=retry)
        if not self.ready or self.engine is None:
            raise APIError(503, "the model is still loading; retry shortly", "engine_loading", headers=retry)
        self.active += 1
        return self.engine

    def release(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    async def _wait_idle(self) -> None:
        while self.active:
            self._idle = anyio.Event()
            await self._idle.wait()

    async def drain(self, grace_s: float) -> None:
        """Stop admitting, give running requests ``grace_s`` seconds, then end the rest."""
        self.draining = True
        log.info("draining", active=self.active, grace_s=grace_s)
        with anyio.move_on_after(grace_s):
            await self._wait_idle()
        if self.active:
            log.warning("shutdown_timeout", aborting=self.active)
        # Closing the engine finishes every unfinished request with "abort"; their streams
        # then end with an error event. It must happen in the task that opened the engine.
        self.stop.set()
        with anyio.move_on_after(10):
            await self.stopped.wait()
            await self._wait_idle()

    async def run_engine(self) -> None:
        try:
            async with Engine(self.settings.config) as engine:
                self.engine = engine
                self.ready = True
                log.info("server_ready", model=self.settings.served_model_name, max_context=engine.max_context)
                await self.stop.wait()
                self.ready = False
        except Exception as exc:
            # Kept, not raised: raising here would tear down the lifespan with a traceback
            # where `aserve serve` wants to print one line and exit non-zero.
            self.load_error = exc
            log.error("engine_failed", error=str(exc))
        finally:
            self.ready = False
            self.stopped.set()


class RequestContext:
    """Request id, structured access log, Bearer auth for /v1, and request outcome counts."""

    def __init__(self, app: ASGIApp, settings: ServerSettings) -> None:
        self.app = app
        self.settings = settings

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
                MutableHeaders(scope=message)["X-Request-Id"] = rid
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=rid):
            try:
                if path.startswith(("/v1/", "/admin/")) and not self._authorized(Headers(scope=scope)):
                    resp = error_response(401, "invalid or missing API key", "authentication_error")
                    resp.headers["WWW-Authenticate"] = "Bearer"
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
    max_body_bytes: int = 1 << 20,
) -> Starlette:
    from starlette.middleware import Middleware

    from aserve.server.routes import routes

    settings = ServerSettings(config, api_key, served_model_name, max_body_bytes)

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

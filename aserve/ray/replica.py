"""One replica of the Ray Serve application: aserve's own HTTP app, with its engine, in process.

The replica does not re-implement the API: it runs the same Starlette app as ``aserve serve``
(``aserve/server/app.py``: schemas, validation, error bodies, SSE, /metrics) under its ASGI
lifespan, and the ingress hands it whole requests (:class:`ForwardedRequest`) through a Ray
Serve deployment handle. :meth:`EngineReplica.forward` plays the server's part of ASGI and
yields the response as it is sent: first ``ResponseStart``, then body chunks.

Cancellation: when the caller cancels (the client left, so the ingress cancelled its
handle call), Ray cancels the task iterating :meth:`forward`; its ``finally`` cancels the app
call, whose SSE response then aborts its engine request, and the KV returns to the pool at
the engine's next commit point (the same path as a client leaving ``aserve serve``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aserve.config import EngineConfig
from aserve.logs import get_logger
from aserve.server.limits import DEFAULT_BODY_LIMITS, BodyLimits

log = get_logger("aserve.ray")

REPLICA_HEADER = "x-aserve-replica"


@dataclass(frozen=True)
class ForwardedRequest:
    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass(frozen=True)
class ResponseStart:
    status: int
    headers: list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class ReplicaOptions:
    config: EngineConfig
    api_key: str | None = None
    served_model_name: str = "gemma-3-270m"
    body: BodyLimits = DEFAULT_BODY_LIMITS


class EngineReplica:
    """The deployment class of the engine replicas (``aserve/ray/app.py`` makes it one)."""

    async def __init__(self, options: ReplicaOptions) -> None:  # type: ignore[misc]  # Serve awaits it
        from ray import serve

        from aserve.server.app import create_app

        self.options = options
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._app = create_app(
            options.config, api_key=options.api_key, served_model_name=options.served_model_name, body=options.body
        )
        self._lifespan_state: dict[str, Any] = {}
        self._to_lifespan: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_lifespan: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        # The lifespan (and with it the engine's task group) runs in one task for the replica's
        # life: an anyio task group must be left by the task that entered it. Ended in __del__.
        self._lifespan = asyncio.create_task(self._run_lifespan(), name="aserve.ray.lifespan")
        await self._to_lifespan.put({"type": "lifespan.startup"})
        started = await self._from_lifespan.get()
        if started["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"replica {self.replica_id}: the app did not start: {started.get('message')}")
        server = self._server
        while not server.ready:  # Serve routes nothing here until __init__ returns
            if server.stopped.is_set():
                raise RuntimeError(f"replica {self.replica_id}: the engine did not start: {server.load_error}")
            await asyncio.sleep(0.1)
        log.info("replica_ready", replica=self.replica_id, pid=os.getpid(), max_context=server.engine.max_context)

    async def _run_lifespan(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self._lifespan_state}
        await self._app(scope, self._to_lifespan.get, self._from_lifespan.put)  # type: ignore[arg-type]

    @property
    def _server(self) -> Any:
        return self._lifespan_state["server"]  # the ServerState the lifespan built

    async def forward(self, request: ForwardedRequest, **routing: Any) -> AsyncIterator[ResponseStart | bytes]:
        """Serve one HTTP request with the app; yields its ``ResponseStart``, then body chunks.

        ``routing`` holds what the request router read (prompt blocks, policy); unused here.
        Cancelling the iteration cancels the app call, which aborts the engine request."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.path.encode(),
            "query_string": request.query_string,
            "root_path": "",
            "headers": request.headers,
            "client": None,
            "server": None,
            "state": dict(self._lifespan_state),
        }
        sent: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        body_given = False

        async def receive() -> dict[str, Any]:
            nonlocal body_given
            if not body_given:
                body_given = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            # Nothing more arrives: a departed client reaches us as the cancellation of this call.
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        async def call() -> None:
            try:
                await self._app(scope, receive, sent.put)  # type: ignore[arg-type]
            finally:
                sent.put_nowait(None)

        # A task of its own, not a task group: this is an async generator that Ray drives,
        # and a generator must not yield inside a task group. The finally below owns it.
        app_call = asyncio.create_task(call(), name=f"aserve.ray.forward[{request.path}]")
        try:
            while (message := await sent.get()) is not None:
                if message["type"] == "http.response.start":
                    headers = [*message.get("headers", []), (REPLICA_HEADER.encode(), self.replica_id.encode())]
                    yield ResponseStart(message["status"], headers)
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        yield bytes(message["body"])
                    if not message.get("more_body", False):
                        break
            await app_call  # re-raises what the app raised (its handlers answer every error first)
        finally:
            if not app_call.done():
                app_call.cancel()
                await asyncio.gather(app_call, return_exceptions=True)

    def record_routing_stats(self) -> dict[str, Any]:
        """The engine's own load, polled by Serve for the request router (``aserve/ray/router.py``)."""
        engine = self._server.engine
        if engine is None:
            return {}
        st = engine.stats()
        return {
            "running": st.running,
            "waiting": st.waiting,
            "kv_total_tokens": st.kv_total_tokens,
            "kv_used_tokens": st.kv_used_tokens,
            "page_size": self.options.config.page_size,
        }

    def check_health(self) -> None:
        """Serve replaces a replica whose check fails: an engine that failed stays failed."""
        server = self._server
        if server.engine_failed is not None or server.stopped.is_set():
            raise RuntimeError(f"replica {self.replica_id}: engine stopped: {server.load_error}")

    async def __del__(self) -> None:
        """Serve's graceful shutdown: close the engine (ending what still runs) in its own task."""
        if self._lifespan.done():
            return
        await self._to_lifespan.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(self._from_lifespan.get(), timeout=60)
        await asyncio.gather(self._lifespan, return_exceptions=True)

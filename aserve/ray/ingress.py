"""The ingress of the Ray application: one OpenAI-compatible endpoint in front of the replicas.

It reads a request's body (it must, to route it), takes the prompt's block hashes
(``aserve/routing/prefix.py``) and forwards the request whole to an engine replica through
the replicas' deployment handle, whose request router (``aserve/ray/router.py``) picks the
replica. What comes back is relayed as it arrives: the replica's status, headers (with
``x-aserve-replica``) and body, SSE included. Validation, error bodies and SSE rendering are
the replica's own aserve app: nothing is parsed or rendered twice.

- A client that leaves cancels the relay, and with it the handle call: Serve cancels the
  replica's generator, which aborts the engine request (``replica.py``).
- A replica that dies mid-request ends only its own requests: with a 503 JSON error if the
  response had not started, else with an SSE error event and ``[DONE]``. Serve starts a
  replacement; the router stops choosing the dead one.
- ``/metrics`` and ``/admin/flush_cache`` go to every replica (``fanout``) and are merged.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from aserve.logs import get_logger
from aserve.ray.metrics import aggregate
from aserve.ray.replica import REPLICA_HEADER, ForwardedRequest, ResponseStart
from aserve.routing.prefix import block_hashes, route_prompt
from aserve.server.errors import APIError, error_body, error_response
from aserve.server.limits import DEFAULT_BODY_LIMITS, BodyLimits
from aserve.server.routes import read_body
from aserve.server.sse import DONE, event

log = get_logger("aserve.ray")

_ROUTED_PATHS = ("/v1/completions", "/v1/chat/completions")
_MAX_FANOUT = 4096


@dataclass(frozen=True)
class IngressOptions:
    routing: str = "prefix"  # prefix, round-robin, least-loaded (aserve/routing/policy.py)
    block_tokens: int = 16  # the replicas' page size: blocks of prompt the router keys on
    body: BodyLimits = DEFAULT_BODY_LIMITS


class _App:
    """An ASGI 3 app object: Serve's server (uvicorn) takes a bare bound method for ASGI 2."""

    def __init__(self, call: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self._call = call

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._call(scope, receive, send)


class Ingress:
    """The ingress deployment's class (``aserve/ray/app.py`` wraps it with ``serve.ingress``)."""

    def __init__(self, replicas: Any, options: IngressOptions) -> None:
        self.replicas = replicas  # the DeploymentHandle of the engine replicas
        self.options = options

    def __serve_build_asgi_app__(self) -> _App:
        return _App(self.asgi)

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        try:
            body = await read_body(Request(scope, receive), self.options.body)
        except APIError as exc:
            await error_response(exc.status_code, exc.message, exc.error_type)(scope, receive, send)
            return
        forwarded = ForwardedRequest(
            scope["method"], scope["path"], scope.get("query_string", b""), list(scope["headers"]), body
        )
        if scope["path"] == "/metrics" and scope["method"] == "GET":
            await self._metrics(forwarded, send)
        elif scope["path"] == "/admin/flush_cache" and scope["method"] == "POST":
            await self._flush(forwarded, send)
        else:
            await self._relay(forwarded, receive, send)

    def _route_kwargs(self, request: ForwardedRequest) -> dict[str, Any]:
        blocks: list[int] = []
        if request.path in _ROUTED_PATHS:
            try:
                prompt = route_prompt(json.loads(request.body))
            except ValueError:
                prompt = None  # the replica answers the 400
            if prompt is not None:
                blocks = block_hashes(prompt, self.options.block_tokens)
        return {"routing": self.options.routing, "route_blocks": blocks}

    async def _relay(self, request: ForwardedRequest, receive: Receive, send: Send) -> None:
        """Forward to the chosen replica and stream its response back, until the client leaves."""
        import ray.exceptions

        stream = self.replicas.options(stream=True).forward.remote(request, **self._route_kwargs(request))
        started: ResponseStart | None = None

        async def relay() -> None:
            nonlocal started
            async for item in stream:
                if isinstance(item, ResponseStart):
                    started = item
                    await send({"type": "http.response.start", "status": item.status, "headers": item.headers})
                else:
                    await send({"type": "http.response.body", "body": item, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            tg.cancel_scope.cancel()

        async def watch_disconnect() -> None:
            try:
                while (await receive())["type"] != "http.disconnect":
                    pass
            except ray.exceptions.TaskCancelledError:
                pass  # Serve's proxy cancelled the request: its client left
            tg.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(relay, name="aserve.ray.relay")
                tg.start_soon(watch_disconnect, name="aserve.ray.watch_disconnect")
        except* (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as group:
            await self._replica_failed(started, group.exceptions[0], send)
        finally:
            stream.cancel()  # a no-op once the stream has ended; else the replica aborts the request

    async def _replica_failed(self, started: ResponseStart | None, exc: BaseException, send: Send) -> None:
        message = "the engine replica serving this request stopped; retry the request"
        log.warning("replica_failed", error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        if started is None:
            body = json.dumps(error_body(503, message, "replica_failed")).encode()
            headers = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in started.headers)
        tail = event(error_body(503, message, "replica_failed")) + DONE if sse else b""
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _each_replica(self, request: ForwardedRequest) -> list[tuple[str, ResponseStart, bytes]]:
        """The request's response from every replica, in replica-id order, once each."""
        answers: list[tuple[str, ResponseStart, bytes]] = []
        seen: set[str] = set()
        for k in range(_MAX_FANOUT):
            start, chunks = None, []
            async for item in self.replicas.options(stream=True).forward.remote(request, fanout=k):
                if isinstance(item, ResponseStart):
                    start = item
                else:
                    chunks.append(item)
            assert start is not None, f"replica answered fanout={k} without a response start"
            replica = dict(start.headers).get(REPLICA_HEADER.encode(), b"?").decode()
            if replica in seen:  # wrapped around: every replica has answered
                break
            seen.add(replica)
            answers.append((replica, start, b"".join(chunks)))
        return answers

    async def _metrics(self, request: ForwardedRequest, send: Send) -> None:
        answers = await self._each_replica(request)
        pages = [(rid, body.decode()) for rid, start, body in answers if start.status == 200]
        text = aggregate(pages).encode()
        headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": text, "more_body": False})

    async def _flush(self, request: ForwardedRequest, send: Send) -> None:
        answers = await self._each_replica(request)
        failed = next(((start, body) for _, start, body in answers if start.status != 200), None)
        if failed is not None:  # the first refusal (401, 409 busy, 503 loading) speaks for all
            start, body = failed
            await send({"type": "http.response.start", "status": start.status, "headers": start.headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        flushed = sum(int(json.loads(body)["flushed_tokens"]) for _, _, body in answers)
        doc = json.dumps({"flushed_tokens": flushed, "replicas": len(answers)}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": doc, "more_body": False})

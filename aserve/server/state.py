"""What one running app holds: its settings, the engine, readiness, admission and the drain.

Built by the app's lifespan (``app.py``) and reached by the routes as ``request.state.server``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from aserve.config import EngineConfig
from aserve.engine import Engine
from aserve.errors import AserveError
from aserve.logs import get_logger
from aserve.server.errors import RETRY_AFTER_S, APIError
from aserve.server.limits import BodyLimits
from aserve.server.metrics import ServerMetrics
from aserve.stats import EngineStats

if TYPE_CHECKING:
    from aserve.ipc.client import EngineClient

log = get_logger("aserve.server")


@dataclass(frozen=True)
class ServerSettings:
    config: EngineConfig
    api_key: str | None
    served_model_name: str
    body: BodyLimits
    core_address: str | None = None  # the engine core's ZeroMQ address, when it runs in another process


class ServerState:
    """Everything one running app holds; built by the lifespan, reached via ``request.state.server``."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.engine: Engine | EngineClient | None = None
        self.ready = False
        self.draining = False
        self.active = 0  # admitted requests whose response has not finished
        self.load_error: BaseException | None = None
        # The engine stopped after a fault while serving (also kept in load_error: the process
        # exits non-zero with it); /health and new requests answer 503 until the process ends.
        self.engine_failed: AserveError | None = None
        self.stop = anyio.Event()  # tells the engine task to close the engine
        self.stopped = anyio.Event()  # the engine task has ended (closed, or failed to load)
        self._idle = anyio.Event()  # replaced each time someone waits for active to reach 0
        self.metrics = ServerMetrics(self._stats)

    def _stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    def model_names(self) -> set[str]:
        return {self.settings.served_model_name, self.settings.config.model}

    def admit(self) -> Engine | EngineClient:
        """The engine for a new request, or a 503 telling the client to come back."""
        retry = {"Retry-After": RETRY_AFTER_S}
        if self.draining:
            raise APIError(503, "the server is shutting down", "engine_closed", headers=retry)
        if self.engine_failed is not None:
            raise APIError(503, str(self.engine_failed), self.engine_failed.error_type, headers=retry)
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
            if self.settings.core_address is not None:
                await self._run_client(self.settings.core_address)
            else:
                async with Engine(self.settings.config) as engine, anyio.create_task_group() as tg:
                    tg.start_soon(self._watch_engine, engine, name="aserve.server.engine_watch")
                    await engine.prepare_structured_outputs()
                    await self._serve_with(engine)
                    tg.cancel_scope.cancel()
        except Exception as exc:
            # Kept, not raised: raising here would tear down the lifespan with a traceback
            # where `aserve serve` wants to print one line and exit non-zero.
            self.load_error = exc
            log.error("engine_failed", error=str(exc))
        finally:
            self.ready = False
            self.stopped.set()

    async def _serve_with(self, engine: Engine | EngineClient) -> None:
        self.engine = engine
        self.ready = True
        log.info("server_ready", model=self.settings.served_model_name, max_context=engine.max_context)
        await self.stop.wait()
        self.ready = False

    async def _watch_engine(self, engine: Engine) -> None:
        """A fault stops the engine for good: 503 at once, then the server exits non-zero."""
        error = await engine.wait_failed()
        self.ready = False
        self.engine_failed = self.load_error = error
        self.stop.set()

    async def _run_client(self, address: str) -> None:
        from aserve.ipc.client import EngineClient

        cfg = self.settings.config
        client = EngineClient(address, stream_interval=cfg.stream_interval, seed=cfg.seed)

        async def core_watch() -> None:
            await client.dead.wait()
            self.ready = False  # 503 at once, before the drain ends the process
            self.load_error = client.broken
            if isinstance(client.broken, AserveError):
                self.engine_failed = client.broken
            self.stop.set()

        async def failure_watch() -> None:
            # The core's engine failed: 503 engine_failed here at once, as in one process,
            # while the core closes its engine; its going then ends this process (core_watch).
            await client.failed.wait()
            self.ready = False
            self.engine_failed = self.load_error = client.failure

        async with client, anyio.create_task_group() as tg:
            tg.start_soon(core_watch, name="aserve.server.core_watch")
            tg.start_soon(failure_watch, name="aserve.server.failure_watch")
            # /health turns 200 only once every front end can serve (loading: 503 until then).
            with anyio.move_on_after(600):
                await client.service_ready.wait()
            if not client.dead.is_set() and client.failure is None:
                await self._serve_with(client)
            elif not client.dead.is_set():
                await client.dead.wait()  # failed before serving: 503 until the core goes
            tg.cancel_scope.cancel()

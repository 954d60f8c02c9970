"""``aserve serve``: Hypercorn on asyncio, with a graceful drain on SIGTERM/SIGINT.

Shutdown order: a signal makes the app stop admitting (503) while running requests get
``--shutdown-timeout`` seconds; the engine is then closed, which ends the stragglers with
an SSE error event; only then does Hypercorn stop listening and close connections.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

import anyio

from aserve.config import EngineConfig
from aserve.logs import get_logger
from aserve.server.limits import DEFAULT_BODY_LIMITS, BodyLimits

log = get_logger("aserve.server")


def hypercorn_config(host: str, port: int, body: BodyLimits = DEFAULT_BODY_LIMITS) -> Any:
    """Hypercorn's config for ``host:port``, the same in one process and for the front ends."""
    from hypercorn.config import Config

    hc = Config()
    hc.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    hc.backlog = 2048  # Hypercorn's 100 is short of 256 clients connecting at once (uvicorn's is 2048)
    hc.keep_alive_timeout = body.idle_connection_s  # longer than clients keep theirs: see BodyLimits
    hc.accesslog = None  # the app logs each request with its id
    # A Logger, not "-": Hypercorn then adds no plain-text handler of its own, and its records
    # reach the root logger's handler from configure_logging (JSON lines with --log-format json).
    # Its INFO ("Running on ...") stays below the root's WARNING; our "serving" event says it.
    hc.errorlog = logging.getLogger("hypercorn.error")
    return hc


async def serve(
    config: EngineConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str = "gemma-3-270m",
    body: BodyLimits = DEFAULT_BODY_LIMITS,
    shutdown_timeout: float = 30.0,
    sockets: Any = None,
    core_address: str | None = None,
) -> int:
    """Serve until a signal (then drain) or until the engine ends. ``sockets``: listening
    sockets bound beforehand (by ``aserve serve``, or by the parent of a front end), else
    bound here. ``core_address`` (an engine core in another process): a front end of
    ``aserve serve --api-workers N``."""
    from hypercorn.app_wrappers import ASGIWrapper
    from hypercorn.asyncio.run import worker_serve

    from aserve.server.app import create_app
    from aserve.server.state import ServerState

    app = create_app(config, api_key=api_key, served_model_name=served_model_name, body=body,
                     core_address=core_address)  # fmt: skip
    hc = hypercorn_config(host, port, body)
    # Our own drain has already ended every request by the time Hypercorn waits on connections.
    hc.graceful_timeout = 5.0

    signalled = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled.set)

    async def shutdown_trigger() -> None:
        state: ServerState = app.state.server  # set by the lifespan, which Hypercorn ran first

        async def on_signal() -> None:
            await signalled.wait()
            log.info("shutdown_requested")
            tg.cancel_scope.cancel()

        async def on_engine_end() -> None:
            await state.stopped.wait()
            tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(on_signal, name="aserve.server.wait_signal")
            tg.start_soon(on_engine_end, name="aserve.server.wait_engine")
        if state.load_error is None:
            await state.drain(shutdown_timeout)

    if core_address is None:
        log.info("serving", host=host, port=port, model=served_model_name, auth=api_key is not None)
    try:
        await worker_serve(ASGIWrapper(app), hc, sockets=sockets, shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    state = getattr(app.state, "server", None)
    if state is not None and state.load_error is not None:
        print(f"error: {state.load_error}", file=sys.stderr)
        return 1
    log.info("shutdown_complete")
    return 0

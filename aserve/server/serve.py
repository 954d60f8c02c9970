"""``aserve serve``: Hypercorn on asyncio, with a graceful drain on SIGTERM/SIGINT.

Shutdown order: a signal makes the app stop admitting (503) while running requests get
``--shutdown-timeout`` seconds; the engine is then closed, which ends the stragglers with
an SSE error event; only then does Hypercorn stop listening and close connections.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from aserve.config import EngineConfig, add_engine_args, engine_config_from_args
from aserve.logs import configure_logging, get_logger

log = get_logger("aserve.server")

API_KEY_ENV = "ASERVE_API_KEY"


def add_serve_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to an ``add_subparsers()`` object; the handler is ``args.handler``."""
    p: argparse.ArgumentParser = subparsers.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help=f"require this Bearer token on /v1 (or set {API_KEY_ENV})")
    p.add_argument("--served-model-name", default=None, help="model name clients use (default: the --model value)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest accepted request body (413 beyond)")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds running requests get to finish after SIGTERM/SIGINT",
    )
    p.add_argument(
        "--api-workers",
        type=int,
        default=None,
        help="HTTP front-end processes around the engine core (0: one process, as embedded); "
        "default: with CUDA one per two spare cores up to 8, on a CPU 0",
    )
    add_engine_args(p)
    p.set_defaults(handler=run_serve)
    return p


def run_serve(args: argparse.Namespace) -> int:
    """Handler of ``aserve serve``: blocks until shut down; 0 after a clean drain."""
    config = engine_config_from_args(args)
    # An empty key would accept an empty token, so treat it as "no key given".
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    from aserve.ipc.launcher import default_api_workers, serve_with_front_ends

    workers = args.api_workers if args.api_workers is not None else default_api_workers(config)
    if workers > 0:
        return asyncio.run(
            serve_with_front_ends(
                config,
                workers=workers,
                host=args.host,
                port=args.port,
                api_key=api_key,
                served_model_name=args.served_model_name or config.model,
                max_body_bytes=args.max_body_bytes,
                shutdown_timeout=args.shutdown_timeout,
                log_format=args.log_format,
            )
        )
    return asyncio.run(
        serve(
            config,
            host=args.host,
            port=args.port,
            api_key=api_key,
            served_model_name=args.served_model_name or config.model,
            max_body_bytes=args.max_body_bytes,
            shutdown_timeout=args.shutdown_timeout,
        )
    )


async def serve(
    config: EngineConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str = "gemma-3-270m",
    max_body_bytes: int = 1 << 20,
    shutdown_timeout: float = 30.0,
    sockets: Any = None,
    core_address: str | None = None,
) -> int:
    """Serve until a signal (then drain) or until the engine ends. ``sockets`` (listening
    sockets made by a parent process) and ``core_address`` (its engine core): a front end of
    ``aserve serve --api-workers N``."""
    from hypercorn.app_wrappers import ASGIWrapper
    from hypercorn.asyncio.run import worker_serve
    from hypercorn.config import Config

    from aserve.server.app import create_app
    from aserve.server.state import ServerState

    app = create_app(config, api_key=api_key, served_model_name=served_model_name, max_body_bytes=max_body_bytes,
                     core_address=core_address)  # fmt: skip
    hc = Config()
    hc.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    # Our own drain has already ended every request by the time Hypercorn waits on connections.
    hc.graceful_timeout = 5.0
    hc.accesslog = None  # the app logs each request with its id

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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m aserve.server serve ...`` until ``aserve serve`` is wired into the CLI."""
    parser = argparse.ArgumentParser(prog="aserve")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_subcommand(sub)
    args = parser.parse_args(argv)
    configure_logging(args.log_format)
    return int(args.handler(args))

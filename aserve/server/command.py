"""The ``serve`` subcommand: its flags, and the choice between one process and front ends.

``--api-workers 0`` runs :func:`aserve.server.serve.serve` here (the engine and the app in one
process); ``N > 0`` runs the engine core here and N front ends (``aserve/ipc/launcher.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from aserve.config import add_engine_args, engine_config_from_args
from aserve.logs import configure_logging
from aserve.ray.command import add_ray_args
from aserve.server.limits import BodyLimits

API_KEY_ENV = "ASERVE_API_KEY"


def add_serve_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to an ``add_subparsers()`` object; the handler is ``args.handler``."""
    p: argparse.ArgumentParser = subparsers.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    p.add_argument(
        "--api-key",
        default=None,
        help=f"require this Bearer token on /v1, /admin, /tokenize and /detokenize (or set {API_KEY_ENV})",
    )
    p.add_argument("--served-model-name", default=None, help="model name clients use (default: the --model value)")
    p.add_argument("--max-body-bytes", type=int, default=BodyLimits.max_bytes,
                   help="largest accepted request body (413 beyond; default: %(default)s)")  # fmt: skip
    p.add_argument("--body-timeout", type=float, default=BodyLimits.timeout_s,
                   help="seconds a request body may take to arrive (408 beyond; default: %(default)s)")  # fmt: skip
    p.add_argument("--sse-keepalive", type=_positive_seconds, default=BodyLimits.sse_keepalive_s,
                   help="seconds an SSE stream may stay silent before a ': keep-alive' comment line "
                   "(default: %(default)s)")  # fmt: skip
    p.add_argument("--keep-alive-timeout", type=_positive_seconds, default=BodyLimits.idle_connection_s,
                   help="seconds a connection may wait for its next request's headers (kept-alive or "
                   "new); keep it above your clients' own keep-alive expiry (default: %(default)s)")  # fmt: skip
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds running requests get to finish after SIGTERM/SIGINT (default: %(default)s)",
    )
    p.add_argument(
        "--api-workers",
        type=int,
        default=None,
        help="HTTP front-end processes around the engine core (0: one process, as embedded); "
        "default: with CUDA one per two spare cores up to 8, on a CPU 0",
    )
    add_ray_args(p)
    add_engine_args(p)
    p.set_defaults(handler=run_serve)
    return p


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def raise_open_files_limit(target: int = 65536) -> tuple[int, int]:
    """Raise this process's soft limit on open files toward ``target`` (never above the hard
    limit; never lowered), as vLLM's server does: every stream is a socket, and a socket the
    client closed stays open until its keep-alive timer ends (``BodyLimits``), so a default
    soft limit of 1024 meets EMFILE under a few hundred connections a second. Front ends
    inherit it. Returns the (soft, hard) limits now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):  # a sandbox may refuse: the server still runs
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def run_serve(args: argparse.Namespace) -> int:
    """Handler of ``aserve serve``: blocks until shut down; 0 after a clean drain."""
    from aserve.server.serve import hypercorn_config, serve

    raise_open_files_limit()

    config = engine_config_from_args(args)
    # An empty key would accept an empty token, so treat it as "no key given".
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    body = BodyLimits(args.max_body_bytes, args.body_timeout, args.sse_keepalive, args.keep_alive_timeout)
    if args.ray:
        from aserve.ray.command import run_serve_on_ray

        return run_serve_on_ray(args, config, api_key=api_key, served_model_name=args.served_model_name or config.model,
                                body=body)  # fmt: skip
    from aserve.ipc.launcher import default_api_workers, serve_with_front_ends

    workers = args.api_workers if args.api_workers is not None else default_api_workers(config)
    # Listen first: a busy port is one line now, not a traceback after the model has loaded.
    try:
        sockets = hypercorn_config(args.host, args.port).create_sockets()
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc} "
              "(another server there? choose one with --port)", file=sys.stderr)  # fmt: skip
        return 2
    common: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "api_key": api_key,
        "served_model_name": args.served_model_name or config.model,
        "body": body,
        "shutdown_timeout": args.shutdown_timeout,
        "sockets": sockets,
    }
    if workers > 0:
        return asyncio.run(serve_with_front_ends(config, workers=workers, log_format=args.log_format, **common))
    return asyncio.run(serve(config, **common))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m aserve.server serve ...`` until ``aserve serve`` is wired into the CLI."""
    parser = argparse.ArgumentParser(prog="aserve")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_subcommand(sub)
    args = parser.parse_args(argv)
    configure_logging(args.log_format)
    return int(args.handler(args))

"""The OpenAI-compatible HTTP server (Starlette app served by Hypercorn)."""

from __future__ import annotations

from aserve.server.app import create_app
from aserve.server.serve import add_serve_subcommand, run_serve, serve

__all__ = ["add_serve_subcommand", "create_app", "run_serve", "serve"]

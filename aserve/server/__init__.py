"""The OpenAI-compatible HTTP server (Starlette app served by Hypercorn).

The names below load on first use (PEP 562): ``aserve --help`` adds the ``serve`` flags from
``aserve.server.command`` without loading the app, its routes or the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aserve.lazy import lazy_attributes

if TYPE_CHECKING:
    from aserve.server.app import create_app
    from aserve.server.command import add_serve_subcommand, run_serve
    from aserve.server.serve import serve

_HOME = {
    "create_app": "aserve.server.app",
    "add_serve_subcommand": "aserve.server.command",
    "run_serve": "aserve.server.command",
    "serve": "aserve.server.serve",
}

__all__ = ["add_serve_subcommand", "create_app", "run_serve", "serve"]


__getattr__, __dir__ = lazy_attributes("aserve.server", globals(), _HOME)

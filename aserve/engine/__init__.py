"""The engine: the public API, admission, request streams and the step loop (plan, launch, commit)."""

from __future__ import annotations

from aserve.engine.engine import Engine, RequestStream

__all__ = ["Engine", "RequestStream"]

"""structlog set-up: one event per request end and per anomaly, console or JSON lines."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure_logging(fmt: str = "console", level: int = logging.INFO) -> None:
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # Resolve sys.stderr per logger, not once: it may be swapped (test capture, daemons).
        logger_factory=lambda *args: structlog.PrintLogger(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str = "aserve") -> Any:
    return structlog.get_logger(name)

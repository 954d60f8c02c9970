"""structlog set-up: one event per request end and per anomaly, console or JSON lines.

Request content must not reach the log by default: tracebacks are rendered without local
variables (a prompt is a local of every frame that handles it). Records of the standard
``logging`` module (Hypercorn's error log, asyncio) go through the same renderer, so that
``--log-format json`` gives JSON on every line.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


class _StderrHandler(logging.Handler):
    """Writes to the current ``sys.stderr``, like the structlog loggers below."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def configure_logging(fmt: str = "console", level: int = logging.INFO) -> None:
    renderer: Any
    if fmt == "json":
        # A traceback becomes one "exception" string, not a bare "exc_info": true.
        renderer = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        # Plain: rich's default renders every frame's locals (the prompt among them), ~60 KB each.
        renderer = [structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # Resolve sys.stderr per logger, not once: it may be swapped (test capture, daemons).
        # WriteLogger writes the line and its newline in one call; PrintLogger's print() makes
        # two, and API workers sharing the parent's stderr then splice each other's lines.
        logger_factory=lambda *args: structlog.WriteLogger(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    # The root logger keeps its level (WARNING unless set): third-party INFO stays quiet.
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)


def get_logger(name: str = "aserve") -> Any:
    if not structlog.is_configured():
        # Nobody configured structlog (an embedding app, a benchmark): its default prints to
        # stdout, where a program's own output goes (a bench's JSON line). Log lines belong on
        # stderr; an app that configures structlog itself, before or after, keeps its own.
        structlog.configure(logger_factory=lambda *args: structlog.WriteLogger(file=sys.stderr))
    return structlog.get_logger(name)

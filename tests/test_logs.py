"""The logging set-up: tracebacks without local variables, and JSON lines that carry them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from aserve.logs import configure_logging, get_logger

SECRET = "a-prompt-that-must-not-be-logged"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers = list(root.handlers)
    yield
    root.handlers[:] = handlers
    structlog.reset_defaults()


def _fail(prompt: str) -> None:
    raise ValueError("boom")


def _log_both() -> None:
    """One error with its traceback through structlog and one through the standard logging
    module (how Hypercorn reports an app that raised)."""
    try:
        _fail(SECRET)
    except ValueError:
        get_logger("aserve.test").exception("unhandled_error", path="/v1/completions")
        logging.getLogger("hypercorn.error").exception("Error in ASGI Framework")


def test_json_lines_carry_the_traceback(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json")
    _log_both()
    lines = capsys.readouterr().err.splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["unhandled_error", "Error in ASGI Framework"]
    for e in events:
        assert e["level"] == "error" and "exc_info" not in e
        assert e["exception"].startswith("Traceback") and "ValueError: boom" in e["exception"]
        assert "_fail" in e["exception"]
    assert events[1]["logger"] == "hypercorn.error"
    assert SECRET not in "\n".join(lines)


def test_console_traceback_shows_no_locals(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("console")
    _log_both()
    err = capsys.readouterr().err
    assert err.count("ValueError: boom") == 2 and "Error in ASGI Framework" in err
    assert SECRET not in err
    assert len(err.splitlines()) < 30


def test_configuring_twice_keeps_one_handler(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("console")
    configure_logging("json")
    logging.getLogger("hypercorn.error").error("once")
    assert len(capsys.readouterr().err.splitlines()) == 1

"""The logging set-up: tracebacks without local variables, and JSON lines that carry them."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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


_WRITER = """
from aserve.logs import configure_logging, get_logger
configure_logging("json")
log = get_logger("aserve.test")
for i in range(2000):
    log.info("request", worker={worker}, i=i, path="/v1/completions", status=499)
"""


def test_processes_sharing_stderr_never_split_a_line(tmp_path: Path) -> None:
    """API workers inherit the parent's stderr: each event must reach it in one write, or two
    workers' lines interleave mid-line (seen in CI as ``status=4992026-...``)."""
    log_path = tmp_path / "shared.log"
    with log_path.open("w") as shared:
        procs = [subprocess.Popen([sys.executable, "-c", _WRITER.format(worker=w)], stderr=shared) for w in range(3)]
        assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    events = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert sorted((e["worker"], e["i"]) for e in events) == [(w, i) for w in range(3) for i in range(2000)]

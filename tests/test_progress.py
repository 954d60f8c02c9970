"""Start-up and long commands show what they do on a terminal, and print no bar characters elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PHASES = """
from aserve.logs import configure_logging
from aserve.progress import phase
configure_logging("console")
with phase("counting things", unit="thing") as update:
    for i in range(3):
        update(i + 1, 3)
with phase("thinking"):
    pass
"""


def _run(args: list[str], terminal: bool, timeout: float = 300) -> str:
    """Run ``python args`` with stderr on a pseudo-terminal (or a pipe) and return what it wrote there."""
    if not terminal:
        out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stderr
    leader, follower = os.openpty()
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=timeout) == 0
    return b"".join(chunks).decode(errors="replace")


def test_a_phase_on_a_terminal_shows_a_bar_and_its_time() -> None:
    text = _run(["-c", PHASES], terminal=True)
    assert "counting things ..." in text
    assert "3/3" in text  # the tqdm bar's count
    assert "counting things: done in" not in text  # the bar shows the time
    assert "thinking: done in" in text


def test_off_a_terminal_a_phase_is_a_log_line_only() -> None:
    text = _run(["-c", PHASES], terminal=False)
    assert "done in" not in text and "3/3" not in text and "\r" not in text
    lines = [line for line in text.splitlines() if "phase_done" in line]
    assert len(lines) == 2 and "counting things" in lines[0] and "seconds=" in lines[0]


@pytest.mark.slow
def test_generate_on_a_terminal_says_what_start_up_is_doing() -> None:
    args = ["-m", "aserve", "generate", "Hello", "--max-tokens", "2", "--num-threads", "2"]
    text = _run(args, terminal=True)
    for line in ("loading weights ...", "warming up: done in"):
        assert line in text, text[-2000:]

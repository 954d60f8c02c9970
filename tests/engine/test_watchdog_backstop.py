"""The watchdog's backstop thread (aserve/engine/watchdog.py): when the event loop itself is
blocked while a step is in flight, the coroutine watchdog cannot run; the thread then writes
every stack to stderr and ends the process with status 70. In a child process, on the CPU (a
launch that never returns) and on CUDA (a spinning kernel the next CUDA call waits behind)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from aserve.engine.watchdog import EXIT_STATUS

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                  reason="needs CUDA")])]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_a_blocked_loop_ends_the_process_with_every_stack(tiny_llama: tuple[Path, Any], device: str) -> None:
    cmd = [sys.executable, "-m", "tests.engine.blocked_loop_child", str(tiny_llama[0]), device]
    # Generous: the child loads torch and the model first; the backstop fires 0.5 s + 5 s into
    # the block, long before the block (120 s, or a 60 s spin) would end by itself.
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert "serving" in out.stdout, out.stderr[-3000:]
    assert "finished without the watchdog" not in out.stdout, out.stdout[-3000:]
    if device == "cuda" and out.returncode == 3:
        # The loop kept running after all: the coroutine watchdog ended the request cleanly.
        assert "clean failure" in out.stdout and "stalled" in out.stdout
        return
    assert out.returncode == EXIT_STATUS, (out.returncode, out.stdout, out.stderr[-3000:])
    assert "event loop is blocked" in out.stderr and "Thread 0x" in out.stderr  # faulthandler's dump

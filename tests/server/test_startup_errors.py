"""Start-up errors a newcomer meets are one clear line, not a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.server.helpers import ROOT


def test_a_busy_port_is_one_line_before_the_model_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "aserve", "serve", "--port", str(port)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "--port" in r.stderr, out
    assert "Traceback" not in out and "engine_started" not in out, out

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


def test_the_open_files_limit_is_raised_never_lowered() -> None:
    """``aserve serve`` raises its soft limit on open files toward 65536 (within the hard
    limit), in a child process here so the test runner's own limit is untouched."""
    import subprocess
    import sys

    code = (
        "import resource\n"
        "from aserve.server.command import raise_open_files_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "new_soft, new_hard = raise_open_files_limit()\n"
        "want = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)\n"
        "assert new_hard == hard and new_soft == want, (new_soft, new_hard, want)\n"
        "assert raise_open_files_limit(target=100) == (want, hard)  # never lowered\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

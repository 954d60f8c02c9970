"""Starting aserve for overlap-ab and soak: a ``aserve serve`` subprocess on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Launched:
    base_url: str
    pid: int  # the `aserve serve` process; its front ends (--api-workers) are its children


@asynccontextmanager
async def aserve_server(args: Sequence[str], log_path: Path) -> AsyncIterator[str]:
    """Yields the base URL; readiness is the caller's check. Stopped with SIGTERM (then KILL)."""
    async with aserve_process(args, log_path) as server:
        yield server.base_url


@asynccontextmanager
async def aserve_process(args: Sequence[str], log_path: Path) -> AsyncIterator[Launched]:
    """Like :func:`aserve_server`, and the server's pid too."""
    port = free_port()
    cmd = [sys.executable, "-m", "aserve", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    await anyio.Path(log_path.parent).mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:  # noqa: ASYNC230 - opening a log file does not block for long
        proc = await anyio.open_process(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield Launched(f"http://127.0.0.1:{port}", proc.pid)
        finally:
            with anyio.CancelScope(shield=True):
                proc.terminate()
                with anyio.move_on_after(60) as scope:
                    await proc.wait()
                if scope.cancelled_caught:
                    proc.kill()
                    await proc.wait()
                await proc.aclose()

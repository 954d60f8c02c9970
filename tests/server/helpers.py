"""A real `aserve serve` subprocess on a free loopback port, and SSE parsing for the tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

MODEL = "gemma-3-270m"
API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``python -m aserve serve *extra``; ``module`` runs another entry point instead (a
    test-only launcher that plants a fault, say: ``("tests.server.fault_launcher", "stall")``)."""

    def __init__(self, *extra: str, log_path: Path, module: Sequence[str] = ("aserve",)) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [
            sys.executable,
            "-m",
            *module,
            "serve",
            "--port",
            str(self.port),
            "--max-running-requests",
            "128",
            "--num-threads",
            "2",
            *extra,
        ]
        env = {**os.environ, "ASERVE_API_KEY": API_KEY}
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        seen_503 = False
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(self.base_url + "/health", timeout=2)
                if r.status_code == 200:
                    self.saw_loading = seen_503
                    return
                seen_503 = seen_503 or r.status_code == 503
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return int(self.proc.returncode)


def parse_sse(raw: str) -> tuple[list[dict[str, Any]], bool]:
    """The JSON events of an SSE body, and whether it ended with `data: [DONE]`."""
    events: list[dict[str, Any]] = []
    done = False
    for block in raw.split("\n\n"):
        if not block.strip() or block.startswith(":"):  # a comment (keep-alive): clients skip it
            continue
        assert block.startswith("data: "), block
        assert not done, "event after [DONE]"
        data = block[len("data: ") :]
        if data == "[DONE]":
            done = True
        else:
            events.append(json.loads(data))
    return events, done


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


@contextmanager
def running_server(*extra: str, log_dir: Path) -> Iterator[ServerProcess]:
    """``aserve serve *extra`` started and ready for the block, stopped after it."""
    srv = ServerProcess(*extra, log_path=log_dir / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


async def stream_completion(http: Any, body: dict[str, Any], started: Any) -> tuple[list[dict[str, Any]], bool]:
    """POST a streaming /v1/completions (status 200 asserted), set ``started`` at the first
    chunk, and return ``parse_sse`` of the whole body."""
    raw = ""
    async with http.stream("POST", "/v1/completions", json=body, headers=AUTH) as r:
        assert r.status_code == 200
        async for chunk in r.aiter_text():
            raw += chunk
            started.set()
    return parse_sse(raw)


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(c) for c in text.split()]


def front_ends(pid: int) -> list[int]:
    """The front-end processes (the spawn start method adds a resource tracker: not one)."""
    out = []
    for c in children(pid):
        try:
            cmd = Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")
        except FileNotFoundError:
            continue
        if "resource_tracker" not in cmd:
            out.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split(") ", 1)[1][0] != "Z"

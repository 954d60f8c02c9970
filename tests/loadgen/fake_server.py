"""A scripted OpenAI-style SSE server: a real Starlette app on a real Hypercorn, in a subprocess.

Each request takes the next behaviour from ``plan`` (cycled, in arrival order). ``ok`` streams
``script``: (delay before the chunk in seconds, tokens in the chunk) pairs, then usage and
``[DONE]``. The server writes down (``log``, keyed by the first prompt token id) when each
request arrived and when each chunk and ``[DONE]`` were handed to Hypercorn, on the same
``perf_counter`` clock as the client in this process: those are the known times to check.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.server.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]

# First chunk after 100 ms, then chunks of 2, 3, 1 and 2 tokens 40 ms apart: 9 tokens in all.
SCRIPT = [(0.100, 1), (0.040, 2), (0.040, 3), (0.040, 1), (0.040, 2)]


@dataclass
class FakeServer:
    script: list[tuple[float, int]] = field(default_factory=lambda: list(SCRIPT))
    plan: list[str] = field(default_factory=lambda: ["ok"])
    prompt_tokens: int = 8
    usage_completion: int | None = None  # None: the true sum of the script
    hang_s: float = 5.0
    loading_s: float = 0.0  # /health answers 503 this long after start, like a loading aserve

    def __post_init__(self) -> None:
        self.port = 0
        self._next = itertools.cycle(range(len(self.plan)))
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.received = 0
        self.finished = 0  # streams that sent their last event
        self._born = time.monotonic()
        self.log: dict[int, dict[str, list[float]]] = {}

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health),
                Route("/v1/models", lambda r: JSONResponse({"object": "list", "data": []})),
                Route("/metrics", lambda r: PlainTextResponse("aserve_device_busy_seconds_total 1.5\n")),
                Route("/log", lambda r: JSONResponse(self.log)),
                Route("/received", lambda r: JSONResponse(self.received)),
                Route("/finished", lambda r: JSONResponse(self.finished)),
                Route("/v1/completions", self._completions, methods=["POST"]),
            ]
        )

    async def _health(self, request: Request) -> Response:
        loading = time.monotonic() - self._born < self.loading_s
        return PlainTextResponse("loading" if loading else "ok", status_code=503 if loading else 200)

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        key = int(body["prompt"][0])
        self.log[key] = {"recv": [time.perf_counter()], "chunks": [], "done": []}
        self.received += 1
        mode = self.plan[next(self._next)]
        if mode == "400":
            return JSONResponse({"error": {"message": "bad request (scripted)"}}, status_code=400)
        if mode == "500":
            return JSONResponse({"error": {"message": "server error (scripted)"}}, status_code=500)
        return StreamingResponse(self._events(mode, self.log[key]), media_type="text/event-stream")

    async def _events(self, mode: str, log: dict[str, list[float]]) -> AsyncIterator[bytes]:
        total = 0
        for k, (delay, n) in enumerate(self.script):
            await asyncio.sleep(delay)
            total += n
            choice = {"index": 0, "text": "x" * n, "token_ids": list(range(n)), "finish_reason": None}
            log["chunks"].append(time.perf_counter())
            yield _event({"id": "c", "object": "text_completion", "choices": [choice]})
            if mode == "hang" and k == 0:
                await asyncio.sleep(self.hang_s)
            if mode == "disconnect" and k == 1:
                raise ConnectionResetError("scripted mid-stream disconnect")
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.usage_completion or total}
        yield _event({"id": "c", "object": "text_completion", "choices": [], "usage": usage})
        log["done"].append(time.perf_counter())
        yield b"data: [DONE]\n\n"
        self.finished += 1

    def _serve(self) -> None:
        async def main() -> None:
            self._stop = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            cfg = Config()
            cfg.bind = [f"127.0.0.1:{self.port}"]
            cfg.accesslog = None
            cfg.errorlog = None
            await serve(self.app(), cfg, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        asyncio.run(main())


class FakeServerProcess:
    """The fake in its own process: its timing is not at the mercy of the client's GIL.

    ``perf_counter`` is CLOCK_MONOTONIC on Linux, one clock for every process, so the times
    it logs still compare directly with the client's.
    """

    def __init__(self, **options: Any) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        spec = json.dumps({**options, "port": self.port})
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.loadgen.fake_server", spec], cwd=ROOT)

    @property
    def received(self) -> int:
        """Completion requests the server has taken (the log keys them by a prompt's first id)."""
        return int(httpx.get(self.base_url + "/received", timeout=5).json())

    @property
    def finished(self) -> int:
        """Streams the server has sent to their end (``[DONE]``)."""
        return int(httpx.get(self.base_url + "/finished", timeout=5).json())

    @property
    def log(self) -> dict[int, dict[str, list[float]]]:
        raw = httpx.get(self.base_url + "/log", timeout=5).json()
        return {int(k): v for k, v in raw.items()}

    def __enter__(self) -> FakeServerProcess:
        for _ in range(200):
            try:
                if httpx.get(self.base_url + "/v1/models", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("fake server did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _event(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


if __name__ == "__main__":
    opts = json.loads(sys.argv[1])
    port = opts.pop("port")
    fake = FakeServer(**opts)
    fake.port = port
    fake._serve()

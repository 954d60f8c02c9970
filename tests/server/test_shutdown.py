"""SIGTERM while streams run: each ends with its full text or a clean error event; exit 0."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.helpers import AUTH, MODEL, ServerProcess, alive, front_ends, stream_completion

pytestmark = pytest.mark.slow


async def _stream(http: httpx.AsyncClient, max_tokens: int, started: asyncio.Event) -> tuple[list[Any], bool]:
    body = {
        "model": MODEL,
        "prompt": "Tell me a story",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
    }
    return await stream_completion(http, body, started)


@pytest.mark.parametrize("api_workers", ["0", "2"], ids=["one-process", "api-workers-2"])
async def test_sigterm_drains_streams(tmp_path: Path, api_workers: str) -> None:
    # A grace period that a loaded machine still finishes 4 tokens in; 3000 tokens never fit it.
    srv = ServerProcess("--shutdown-timeout", "8", "--max-waiting-requests", "32", "--api-workers", api_workers,
                        log_path=tmp_path / "server.log")  # fmt: skip
    try:
        srv.wait_ready()
        assert srv.saw_loading, "/health should answer 503 while the model loads"
        fes = front_ends(srv.proc.pid)
        assert len(fes) == int(api_workers), fes
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as http:
            # More sequences than the waiting queue holds: 429 with Retry-After.
            body = {"model": MODEL, "prompt": "hi", "n": 33, "max_tokens": 1}
            r = await http.post("/v1/completions", json=body, headers=AUTH)
            assert r.status_code == 429 and r.headers["retry-after"], r.text
            assert r.json()["error"]["type"] == "overloaded_error"
            started = [asyncio.Event() for _ in range(20)]
            # Half finish well inside the grace period, half cannot and must be cut off.
            tasks = [asyncio.create_task(_stream(http, 4 if i % 2 == 0 else 3000, started[i])) for i in range(20)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            srv.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            # Draining: no new work is admitted, and health says so.
            assert (await http.get("/health")).status_code == 503
            r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}, headers=AUTH)
            assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == 503
            results = await asyncio.gather(*tasks)
        completed = aborted = 0
        for i, (events, done) in enumerate(results):
            assert done, f"stream {i} did not end with [DONE]"
            last = events[-1]
            if "error" in last:
                assert last["error"]["code"] == 503 and last["error"]["type"] == "request_aborted"
                aborted += 1
            else:
                assert last["choices"][0]["finish_reason"] == "length"
                assert len(events) >= 1
                completed += 1
        assert completed >= 10 and aborted >= 1, (completed, aborted)
        assert srv.proc.wait(30) == 0, srv.log_tail()
        assert "shutdown_complete" in srv.log_tail()
        assert not [p for p in fes if alive(p)], "a front end outlived the server"
    finally:
        srv.stop()

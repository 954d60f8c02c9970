"""``aserve serve --api-workers N``: the engine core with front ends in their own processes.

The everyday behaviour (openai client, SSE, n, logprobs, usage, stops, aborts, 429, auth,
health, metrics, OpenAPI, SIGTERM) runs in ``test_server.py`` and ``test_shutdown.py`` for
both shapes; these are the faults only this shape has: a front end killed under load, and
the core killed under its front ends."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.helpers import AUTH, MODEL, ServerProcess, alive, front_ends, metric, parse_sse

pytestmark = pytest.mark.slow


async def _stream(base_url: str, max_tokens: int, served_by: asyncio.Queue[str] | None = None) -> tuple[str, Any]:
    """One stream on its own connection (so the kernel may hand it to either front end);
    ``served_by`` receives the name of the front end that answered."""
    body = {"model": MODEL, "prompt": "Count to a hundred", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0}  # fmt: skip
    raw = ""
    try:
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=120) as http,
            http.stream("POST", "/v1/completions", json=body, headers=AUTH) as r,
        ):
            assert r.status_code == 200
            if served_by is not None:
                served_by.put_nowait(r.headers["x-aserve-front-end"])
            async for chunk in r.aiter_text():
                raw += chunk
    except httpx.TransportError as exc:
        return "cut", exc
    events, done = parse_sse(raw)
    return ("done" if done else "cut"), events


async def _wait_until(cond: Any, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s}s: {what}")
        await asyncio.sleep(0.1)


async def test_a_killed_front_end_loses_only_its_streams_and_is_replaced(tmp_path: Path) -> None:
    srv = ServerProcess("--api-workers", "2", log_path=tmp_path / "server.log")
    try:
        srv.wait_ready()
        await _wait_until(lambda: len(front_ends(srv.proc.pid)) == 2, 60, "two front ends")
        # Open streams until both front ends serve some (the kernel picks which accepts).
        served_by: asyncio.Queue[str] = asyncio.Queue()
        tasks: list[asyncio.Task[tuple[str, Any]]] = []
        names: list[str] = []
        while len(set(names)) < 2:
            assert len(tasks) < 64, f"one front end took every connection: {names}"
            tasks.append(asyncio.create_task(_stream(srv.base_url, 80, served_by)))
            names.append(await asyncio.wait_for(served_by.get(), 30))
        victim_name = names[0]
        victim = int(victim_name.removeprefix("fe-"))
        os.kill(victim, signal.SIGKILL)
        results = await asyncio.gather(*tasks)
        for name, (status, events) in zip(names, results, strict=True):
            if name == victim_name:
                assert status == "cut"
            else:  # streams on the survivor finish whole
                assert status == "done" and events[-1]["choices"][0]["finish_reason"] == "length", events[-1]
        # The core aborted the victim's requests: KV all back, nothing running; a new front end.
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:

            async def settled() -> bool:
                text = (await http.get("/metrics")).text
                try:
                    return metric(text, "aserve_kv_used_tokens") == 0 and metric(text, "aserve_requests_running") == 0
                except KeyError:
                    # The replacement front end answered before its link to the core was up: its
                    # page has the request-side metrics only (CI at dabb7f1 met this once).
                    return False

            deadline = time.monotonic() + 30
            while not await settled():
                assert time.monotonic() < deadline, "the dead front end's requests still hold KV"
                await asyncio.sleep(0.2)
            await _wait_until(lambda: len(front_ends(srv.proc.pid)) == 2 and victim not in front_ends(srv.proc.pid),
                              30, "a replacement front end")  # fmt: skip
            for _ in range(4):  # either front end answers
                r = await http.post("/v1/completions", headers=AUTH,
                                    json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0})  # fmt: skip
                assert r.status_code == 200, r.text
        log = srv.log_tail(100_000)
        assert "front_end_died" in log
        # The core aborted the victim's streams itself (their 80 tokens were not done when it died).
        aborted = [int(n) for n in re.findall(r"front_end_gone.*?aborted=(\d+)", log)]
        assert aborted and aborted[0] >= 1, aborted
    finally:
        srv.stop()


async def test_the_core_dying_takes_its_front_ends_down_without_a_hang(tmp_path: Path) -> None:
    srv = ServerProcess("--api-workers", "2", log_path=tmp_path / "server.log")
    try:
        srv.wait_ready()
        await _wait_until(lambda: len(front_ends(srv.proc.pid)) == 2, 60, "two front ends")
        fes = front_ends(srv.proc.pid)
        stream = asyncio.create_task(_stream(srv.base_url, 2000))
        await asyncio.sleep(1.0)
        os.kill(srv.proc.pid, signal.SIGKILL)  # the core (and supervisor) is gone at once
        status, events = await asyncio.wait_for(stream, 30)
        # The stream ends (an error event, or the connection closed); it does not hang.
        assert status == "cut" or events[-1]["error"]["type"] == "engine_closed", events[-1]
        # From the moment they see the core gone until they exit, the front ends answer 503
        # (or, once exiting, no longer accept): never 200, and never a hang.
        statuses: list[int] = []
        await asyncio.sleep(1.0)  # the other front end's socket monitor tells it too (a loaded loop: later)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=5) as http:
            while any(alive(p) for p in fes) and len(statuses) < 400:
                try:
                    statuses.append((await http.get("/health")).status_code)
                except httpx.TransportError:
                    statuses.append(0)
                await asyncio.sleep(0.05)
        assert set(statuses) <= {503, 0}, statuses
        await _wait_until(lambda: not any(alive(p) for p in fes), 15, "the front ends exit")
    finally:
        for p in front_ends(srv.proc.pid):
            os.kill(p, signal.SIGKILL)
        srv.stop()

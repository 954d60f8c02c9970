"""A real ``aserve serve`` whose engine dies while serving (issue 18): a fault in the model's
forward, or a step that never completes (the watchdog). The request that met the fault and a
stream in flight end with an OpenAI-style 503 ``engine_failed`` error, not a 500 or a hang;
``/health`` and new requests answer 503 ``engine_failed`` while the engine closes (in every
front end, with ``--api-workers``); the process then exits 1
with one error line. The fault is planted by a test-only launcher
(``tests/server/fault_launcher.py``) around the real CLI, Hypercorn and engine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.fault_launcher import TRIGGER
from tests.server.helpers import AUTH, ServerProcess, stream_completion

NAME = "tiny"


async def _stream(http: httpx.AsyncClient, started: asyncio.Event) -> list[dict[str, Any]]:
    body = {"model": NAME, "prompt": [1, 5, 6, 7], "max_tokens": 400, "stream": True, "ignore_eos": True}
    events, _ = await stream_completion(http, body, started)
    return events


@pytest.mark.parametrize(
    ("fault", "api_workers"), [("forward", "0"), ("stall", "0"), ("forward", "2")],
    ids=["forward", "stall", "forward-api-workers-2"],
)  # fmt: skip
async def test_a_dead_engine_answers_503_and_the_server_exits(
    tiny_llama: tuple[Path, Any], tmp_path: Path, fault: str, api_workers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With front-end processes (the default on CUDA) the core tells every front end of the
    fault at once; they answer 503 ``engine_failed`` while the engine closes, then exit with it."""
    one_process = api_workers == "0"
    release = tmp_path / "release"  # the planted fault holds the engine's close until this exists
    monkeypatch.setenv("ASERVE_TEST_RELEASE", str(release))
    srv = ServerProcess("--model", str(tiny_llama[0]), "--served-model-name", NAME, "--watchdog-timeout", "10",
                        "--api-workers", api_workers, log_path=tmp_path / "server.log",
                        module=("tests.server.fault_launcher", fault))  # fmt: skip
    try:
        srv.wait_ready()
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as http:
            assert (await http.get("/health")).status_code == 200
            started = asyncio.Event()
            stream = asyncio.create_task(_stream(http, started))
            await asyncio.wait_for(started.wait(), 60)
            # The request whose prefill meets the fault.
            r = await http.post("/v1/completions", headers=AUTH,
                                json={"model": NAME, "prompt": [1, TRIGGER, TRIGGER, TRIGGER], "max_tokens": 4})  # fmt: skip
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert err["type"] == "engine_failed" and err["code"] == 503, err
            reason = "stalled" if fault == "stall" else "injected fault"
            assert reason in err["message"], err
            # The stream in flight ends with the same error, in band.
            events = await asyncio.wait_for(stream, 60)
            assert events[-1]["error"]["type"] == "engine_failed", events[-1]
            # While the engine closes: 503 everywhere, saying why. With front ends, every one
            # of them (the core tells them all at once), not only the one that met the fault.
            answered: set[str] = set()
            for _ in range(1 if one_process else 40):
                # Fresh connections, several at once: the kernel hands a shared listening socket's
                # connections to whichever process accepts first, and one after another they can
                # all go to the same front end (CI saw 40 of 40 once).
                for health in await asyncio.gather(
                    *(http.get("/health", headers={"Connection": "close"}) for _ in range(4))
                ):
                    body = health.json()
                    assert health.status_code == 503 and body["status"] == "failed", health.text
                    assert body["type"] == "engine_failed" and reason in body["error"], body
                    answered.add(health.headers.get("X-Aserve-Front-End", "one process"))
                r = await http.post("/v1/completions", headers={**AUTH, "Connection": "close"},
                                    json={"model": NAME, "prompt": "hi", "max_tokens": 2})  # fmt: skip
                assert r.status_code == 503 and r.json()["error"]["type"] == "engine_failed", r.text
                if len(answered) == (1 if one_process else 2):
                    break
            assert len(answered) == (1 if one_process else 2), answered
        release.touch()
        # Then the process ends on its own, non-zero, with the reason on stderr.
        assert await asyncio.to_thread(srv.proc.wait, 60) == 1
        assert "error: the engine failed" in srv.log_tail(20000)
    finally:
        srv.stop()

"""Hostile clients against a real `aserve serve`: bodies cut short, lone surrogates, and what
the log shows of them (no tracebacks, no request content, JSON on every line when asked)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.helpers import API_KEY, AUTH, MODEL, ServerProcess, running_server

pytestmark = pytest.mark.slow
BODY_TIMEOUT_S = 2


@pytest.fixture(scope="module", params=["0", "2"], ids=["one-process", "api-workers-2"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server("--api-workers", request.param, "--body-timeout", str(BODY_TIMEOUT_S),
                        log_dir=tmp_path_factory.mktemp("srv")) as srv:  # fmt: skip
        yield srv


def _cut_short(port: int, clients: int) -> None:
    """``clients`` POSTs that promise 100 bytes of body, send one, and hang up."""
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Length: 100\r\n\r\n{{"
    ).encode()
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(clients)]
    for s in socks:
        s.sendall(head)
    time.sleep(0.2)  # let the server start reading each body before the hang-up
    for s in socks:
        s.close()


def _log_lines(srv: ServerProcess) -> list[str]:
    srv._log.flush()
    return srv.log_path.read_text(errors="replace").splitlines()


def test_body_cut_short_is_not_an_error(server: ServerProcess) -> None:
    clients = 20
    before = len(_log_lines(server))
    _cut_short(server.port, clients)
    start = time.monotonic()
    r = httpx.get(server.base_url + "/health", timeout=30)
    took = time.monotonic() - start
    assert r.status_code == 200
    assert took < 5.0, f"/health took {took:.1f}s after {clients} clients hung up mid-body"
    # Wait until every cut-short request has logged its end, then look at what it logged.
    deadline = time.monotonic() + 30
    while True:
        new = _log_lines(server)[before:]
        ended = [ln for ln in new if "path=/v1/completions" in ln]
        if len(ended) >= clients or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    text = "\n".join(new)
    assert len(ended) == clients, text[-4000:]
    assert all("status=499" in ln for ln in ended), text[-4000:]
    assert "Traceback" not in text and "unhandled_error" not in text and "Error in ASGI" not in text, text[-4000:]
    assert len(new) < 20 * clients, f"{len(new)} log lines for {clients} clients"
    # The server still serves.
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 1}
    assert httpx.post(server.base_url + "/v1/completions", json=body, headers=AUTH, timeout=60).status_code == 200


def test_a_body_that_stops_arriving_gets_408_and_the_connection_closes(server: ServerProcess) -> None:
    """Slowloris: headers and one byte of a 100-byte body, then nothing."""
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Length: 100\r\n\r\n{{"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        s.sendall(head)
        start = time.monotonic()
        data = b""
        while chunk := s.recv(65536):  # until the server closes the connection
            data += chunk
        took = time.monotonic() - start
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"did not arrive within" in data
    assert BODY_TIMEOUT_S <= took < BODY_TIMEOUT_S + 30, took


# Raw JSON text, so that each escape reaches the server exactly as a hostile client wrote it.
SURROGATES: list[tuple[str, str, bytes, str]] = [
    ("prompt", "/v1/completions", rb'{"model": "gemma-3-270m", "prompt": "x \ud800"}', "prompt"),
    ("prompt list", "/v1/completions", rb'{"model": "gemma-3-270m", "prompt": ["x \udfff"]}', "prompt.0"),
    ("model", "/v1/completions", rb'{"model": "x \ud800", "prompt": "hi"}', "model"),
    (
        "chat content",
        "/v1/chat/completions",
        rb'{"model": "gemma-3-270m", "messages": [{"role": "user", "content": "a \uDC00 b"}]}',
        "messages.0.content",
    ),
    (
        "chat model",
        "/v1/chat/completions",
        rb'{"model": "\ud800", "messages": [{"role": "user", "content": "hi"}]}',
        "model",
    ),
]


@pytest.mark.parametrize(("path", "body", "param"), [r[1:] for r in SURROGATES], ids=[r[0] for r in SURROGATES])
def test_lone_surrogate_is_a_400(server: ServerProcess, path: str, body: bytes, param: str) -> None:
    r = httpx.post(server.base_url + path, content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400 and err["param"] == param, err
    assert "surrogate" in err["message"]


def test_surrogate_pair_is_fine(server: ServerProcess) -> None:
    """A whole pair (an emoji) is ordinary text; only the unpaired half is refused."""
    body = rb'{"model": "gemma-3-270m", "prompt": "Smile \ud83d\ude00", "max_tokens": 1}'
    r = httpx.post(server.base_url + "/v1/completions", content=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("api_workers", ["0", "2"], ids=["one-process", "api-workers-2"])
def test_json_log_is_json_on_every_line(tmp_path: Path, api_workers: str) -> None:
    """With --log-format json every line is JSON (Hypercorn's own lines too), and no request
    content reaches the log."""
    srv = ServerProcess("--log-format", "json", "--api-workers", api_workers, log_path=tmp_path / "server.log")
    secret = "do-not-log-this-prompt"
    try:
        srv.wait_ready()
        ok = {"model": MODEL, "prompt": secret, "max_tokens": 1}
        r = httpx.post(srv.base_url + "/v1/completions", json=ok, headers=AUTH, timeout=60)
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        bad = f'{{"model": "{MODEL}", "prompt": "{secret} \\ud800"}}'.encode()
        assert httpx.post(srv.base_url + "/v1/completions", content=bad, headers=AUTH).status_code == 400
        assert httpx.post(srv.base_url + "/v1/completions", content=b"{", headers=AUTH).status_code == 400
        _cut_short(srv.port, 3)
        assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 200
    finally:
        assert srv.stop() == 0, srv.log_tail()
    lines = srv.log_path.read_text(errors="replace").splitlines()
    assert lines
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"not JSON: {line!r}")
        assert isinstance(event, dict) and "event" in event, line
        assert event.get("exc_info") is None, line  # a traceback comes formatted, as "exception"
    assert secret not in "\n".join(lines)
    # The request's id end to end: the front end's access line and the core's request_end.
    events = [json.loads(line) for line in lines]
    assert [e["status"] for e in events if e["event"] == "request" and e.get("request_id") == rid] == [200]
    ends = [e for e in events if e["event"] == "request_end" and rid in e["rid"]]
    assert len(ends) == 1 and ends[0]["output_tokens"] == 1, ends

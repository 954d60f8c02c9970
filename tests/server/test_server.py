"""End-to-end tests of `aserve serve` (real Hypercorn on loopback, CPU, default model).

One server process serves the whole module; workloads stay tiny (a few tokens) so the module
runs in well under three minutes on two cores.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.server.helpers import API_KEY, AUTH, MODEL, ServerProcess, metric, parse_sse, running_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["0", "2"], ids=["one-process", "api-workers-2"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Every test runs against both shapes of ``aserve serve``: the engine and the HTTP app in
    one process, and the engine core with two front-end processes over ZeroMQ."""
    with running_server("--max-body-bytes", "65536", "--api-workers", request.param,
                        log_dir=tmp_path_factory.mktemp("srv")) as srv:  # fmt: skip
        yield srv


def test_health_models_openapi(server: ServerProcess) -> None:
    r = httpx.get(server.base_url + "/health")
    assert r.status_code == 200 and r.headers["x-request-id"]
    models = httpx.get(server.base_url + "/v1/models", headers=AUTH).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    # One model by name (the openai client's models.retrieve), and a name not served.
    one = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0).models.retrieve(MODEL)
    assert one.id == MODEL
    missing = httpx.get(server.base_url + "/v1/models/gpt-9", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    doc = httpx.get(server.base_url + "/openapi.json").json()
    assert doc["openapi"].startswith("3.") and "/v1/chat/completions" in doc["paths"]
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(doc)


def test_completions_stream_equals_non_stream(client: openai.OpenAI, tokenizer: Any) -> None:
    prompt = "The capital of France is"
    kw: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    full = client.completions.create(**kw, logprobs=1, extra_body={"ignore_eos": True})
    assert full.usage is not None
    assert full.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=True))
    assert full.usage.completion_tokens == 8
    assert full.choices[0].logprobs is not None and len(full.choices[0].logprobs.tokens or []) == 8
    chunks = list(
        client.completions.create(
            **kw, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.model_dump() == full.usage.model_dump()
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_stream_equals_non_stream_with_n(client: openai.OpenAI, tokenizer: Any) -> None:
    from aserve.tokenizer.chat import apply_chat_template

    messages: list[Any] = [{"role": "user", "content": "Say hi."}]
    kw: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0, "n": 2}
    full = client.chat.completions.create(**kw)
    prompt_ids = tokenizer.encode(apply_chat_template(tokenizer, messages), add_special_tokens=False)
    assert full.usage is not None and full.usage.prompt_tokens == len(prompt_ids)
    assert len(full.choices) == 2 and full.choices[0].message.content == full.choices[1].message.content
    stream = client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    texts = {0: "", 1: ""}
    usage = None
    for chunk in stream:
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
        usage = chunk.usage or usage
    assert texts == {c.index: c.message.content for c in full.choices}
    assert usage is not None and usage.model_dump() == full.usage.model_dump()
    # Chat logprobs come back per token, so they also count the generated tokens.
    one = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    assert one.choices[0].logprobs is not None and one.usage is not None
    content = one.choices[0].logprobs.content or []
    assert len(content) == one.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)


async def _stream(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    async with http.stream("POST", "/v1/completions", json=body, headers=AUTH) as r:
        assert r.status_code == 200, await r.aread()
        raw = (await r.aread()).decode()
    return parse_sse(raw)


def _body(max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hello", "max_tokens": max_tokens, "stream": True, "ignore_eos": True, **kw}


async def test_100_concurrent_streams(server: ServerProcess) -> None:
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as http:
        results = await asyncio.gather(*(_stream(http, _body(3, seed=i, temperature=1.0)) for i in range(100)))
    for events, done in results:
        assert done
        assert events[-1]["choices"][0]["finish_reason"] == "length"


async def test_300_streams_at_once_from_one_client_twice_on_its_connections(server: ServerProcess) -> None:
    """Issue 14's dropped-stream suspects, in one client: 300 streams opened at once (more than
    Hypercorn's default listen backlog of 100, which the server raises, and more than it runs at
    once: the rest queue), then 300 more over the same kept-alive connections, some of them idle
    for seconds by then. Every stream ends whole. (With Hypercorn's 5 s keep-alive this lost
    streams to ReadError on this VM now and then: the server closed connections the client was
    sending on.)"""
    limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=300, limits=limits) as http:
        for wave in range(2):
            results = await asyncio.gather(*(_stream(http, _body(2, seed=i, temperature=1.0)) for i in range(300)))
            for events, done in results:
                assert done, f"wave {wave}: a stream ended without [DONE]"
                assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_an_idle_kept_alive_connection_outlasts_the_clients_expiry(server: ServerProcess) -> None:
    """A connection idle for 6 s still carries the next request: the server keeps idle
    connections longer than clients keep theirs (httpx's 5 s), so it never closes one just as
    a client sends on it (the race behind issue 14's dropped streams; Hypercorn's own 5 s
    closed this connection)."""
    import socket
    import time

    request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode()

    def answer(sock: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection; got {data!r}"
            data += chunk
        return data

    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        assert answer(sock).startswith(b"HTTP/1.1 200")
        time.sleep(6.0)
        sock.sendall(request)
        assert answer(sock).startswith(b"HTTP/1.1 200")


def test_streamed_stop_string_equals_non_streamed(client: openai.OpenAI) -> None:
    """A stop string taken from the middle of the greedy text ends both forms at the same
    character, cut from the text (the stream never shows a character of it)."""
    kw: dict[str, Any] = {"model": MODEL, "prompt": "The capital of France is", "temperature": 0}
    free = client.completions.create(**kw, max_tokens=24, extra_body={"ignore_eos": True}).choices[0].text
    stop = free[len(free) // 2 : len(free) // 2 + 3]
    assert len(stop) == 3 and stop.strip(), free
    want = free[: free.index(stop)]
    full = client.completions.create(**kw, max_tokens=24, stop=[stop], extra_body={"ignore_eos": True})
    assert full.choices[0].text == want and full.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(**kw, max_tokens=24, stop=[stop], stream=True,
                                            extra_body={"ignore_eos": True}))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


async def test_a_full_queue_answers_429_and_the_rest_are_served(tmp_path_factory: pytest.TempPathFactory) -> None:
    """With room for one running and one waiting request, six at once: the engine (the core,
    with front ends) refuses what does not fit with a 429 and an OpenAI-style body; the ones
    it took finish whole, and nothing is left behind."""
    for workers in ("0", "2"):
        with running_server("--max-running-requests", "1", "--max-waiting-requests", "1", "--api-workers", workers,
                            log_dir=tmp_path_factory.mktemp(f"queue{workers}")) as srv:  # fmt: skip
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as http:

                async def one(i: int) -> tuple[int, dict[str, Any]]:
                    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 24, "ignore_eos": True, "seed": i}
                    r = await http.post("/v1/completions", json=body, headers=AUTH)
                    return r.status_code, r.json()

                answers = await asyncio.gather(*(one(i) for i in range(6)))
                codes = sorted(code for code, _ in answers)
                assert set(codes) == {200, 429}, (workers, codes)
                for code, body in answers:
                    if code == 429:
                        assert body["error"]["code"] == 429 and body["error"]["message"], body
                    else:
                        assert body["usage"]["completion_tokens"] == 24
                await _wait_idle(http)


async def _wait_idle(http: httpx.AsyncClient, timeout_s: float = 120.0) -> str:
    """The /metrics text once the engine is idle: nothing running or waiting, no KV in use.

    An aborted request's KV returns when the steps in flight that read it are committed (up
    to the pipeline depth of them), so after the clients leave it can outlive the request by
    two whole steps. Here one step decodes ~50 sequences through a 262k-token LM head on
    two CPU threads: 0.3 s on a quiet machine, ~10 s when another process's torch threads
    compete for the two cores (measured), so the deadline is generous, not a latency bound.
    A leak does not hide behind it: KV in use while nothing runs, waits, or is in flight
    (``aserve_pipeline_in_use``) can never return, and fails at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        text = (await http.get("/metrics")).text
        kv, running, waiting, in_flight = (
            metric(text, m)
            for m in ("aserve_kv_used_tokens", "aserve_requests_running", "aserve_requests_waiting",
                      "aserve_pipeline_in_use")
        )  # fmt: skip
        if kv == running == waiting == 0:
            return text
        if running == waiting == in_flight == 0:
            raise AssertionError(f"KV leak: {kv:g} tokens in use with no request running, waiting or in flight")
        if loop.time() > deadline:
            raise AssertionError(f"engine did not return to idle within {timeout_s:g} s:\n" + text)
        await asyncio.sleep(0.1)


async def test_disconnecting_clients_free_kv(server: ServerProcess) -> None:
    rng = random.Random(0)

    async def leave_early(http: httpx.AsyncClient, after: int) -> None:
        async with http.stream("POST", "/v1/completions", json=_body(64), headers=AUTH) as r:
            seen = 0
            async for _ in r.aiter_lines():
                seen += 1
                if seen > after:
                    break  # closing the response drops the connection mid-stream

    async def give_up_waiting(http: httpx.AsyncClient) -> None:
        # A non-streamed request whose client times out must be aborted too.
        body = {**_body(64), "stream": False}
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/v1/completions", json=body, headers=AUTH, timeout=0.5)

    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        await asyncio.gather(
            *(leave_early(http, rng.randrange(0, 8)) for _ in range(50)), *(give_up_waiting(http) for _ in range(3))
        )
        text = await _wait_idle(http)
    assert metric(text, 'aserve_requests_total{endpoint="completions",outcome="abort"}') >= 53


MALFORMED: list[tuple[str, bytes, dict[str, str], int, str | None]] = [
    ("invalid json", b'{"model": "gemma-3-270m", "prompt": ', {}, 400, None),
    ("not an object", b"[1, 2]", {}, 422, None),
    ("wrong type", json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": "8"}).encode(), {}, 422, "max_tokens"),
    ("missing prompt", json.dumps({"model": MODEL}).encode(), {}, 422, "prompt"),
    ("missing model", json.dumps({"prompt": "hi"}).encode(), {}, 422, "model"),
    (
        "negative max_tokens",
        json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": -1}).encode(),
        {},
        400,
        "max_tokens",
    ),
    (
        "huge max_tokens",
        json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 10**9}).encode(),
        {},
        400,
        "max_tokens",
    ),
    ("n = 0", json.dumps({"model": MODEL, "prompt": "hi", "n": 0}).encode(), {}, 400, "n"),
    ("top_p = 2", json.dumps({"model": MODEL, "prompt": "hi", "top_p": 2}).encode(), {}, 400, "top_p"),
    (
        "temperature = 1e9",
        json.dumps({"model": MODEL, "prompt": "hi", "temperature": 1e9}).encode(),
        {},
        400,
        "temperature",
    ),
    ("oversized body", json.dumps({"model": MODEL, "prompt": "x" * 70000}).encode(), {}, 413, None),
    ("invalid utf-8", b'{"model": "gemma-3-270m", "prompt": "\xff\xfe"}', {}, 400, None),
    ("huge integer", b'{"model": "gemma-3-270m", "prompt": "hi", "max_tokens": ' + b"1" * 5000 + b"}", {}, 400, None),
    ("unknown model", json.dumps({"model": "gpt-9", "prompt": "hi"}).encode(), {}, 404, "model"),
    (
        "wrong api key",
        json.dumps({"model": MODEL, "prompt": "hi"}).encode(),
        {"Authorization": "Bearer nope"},
        401,
        None,
    ),
    ("no api key", json.dumps({"model": MODEL, "prompt": "hi"}).encode(), {"Authorization": ""}, 401, None),
    ("empty prompt", json.dumps({"model": MODEL, "prompt": ""}).encode(), {}, 400, "prompt"),
    ("bad token id", json.dumps({"model": MODEL, "prompt": [1, 10**9]}).encode(), {}, 400, "prompt"),
    ("prompt too long", json.dumps({"model": MODEL, "prompt": [2] * 9000}).encode(), {}, 400, "prompt"),
    *(
        (
            f"logit_bias {b}",
            json.dumps({"model": MODEL, "prompt": "hi", "logit_bias": b}).encode(),
            {},
            400,
            "logit_bias",
        )
        for b in ({"x": 1}, {"5": 101}, {"-3": 1}, {str(10**9): 1})
    ),
    (
        "min_tokens > max_tokens",
        json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2, "min_tokens": 3}).encode(),
        {},
        400,
        "min_tokens",
    ),
]


def test_logit_bias_steers_tokens(client: openai.OpenAI, tokenizer: Any) -> None:
    """OpenAI's logit_bias (token ids as string keys): +100 on one token makes greedy pick it
    every time; streamed and non-streamed agree."""
    forced = tokenizer.encode(" Paris")[0]
    kw: dict[str, Any] = {"model": MODEL, "prompt": "Name a colour:", "max_tokens": 4, "temperature": 0,
                          "logit_bias": {str(forced): 100}, "extra_body": {"ignore_eos": True}}  # fmt: skip
    full = client.completions.create(**kw)
    assert full.choices[0].text == tokenizer.decode([forced] * 4)
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)
    assert streamed == full.choices[0].text
    # vLLM's min_tokens as an extra field: no EOS before it, so min_tokens == max_tokens is exact.
    short = client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, temperature=0,
                                      extra_body={"min_tokens": 5})  # fmt: skip
    assert short.usage is not None and short.usage.completion_tokens == 5


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_structured_outputs_through_the_openai_client(client: openai.OpenAI) -> None:
    """response_format json_schema (chat, streamed and not) and the structured_outputs
    extension (completions) through both server shapes; jsonschema is the judge."""
    import jsonschema

    fmt: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    messages: Any = [{"role": "user", "content": "Invent a person."}]
    for seed in range(3):
        full = client.chat.completions.create(model=MODEL, messages=messages, response_format=fmt, max_tokens=60,
                                              temperature=1.0, seed=seed)  # fmt: skip
        assert full.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(full.choices[0].message.content or ""), PERSON)
        chunks = client.chat.completions.create(model=MODEL, messages=messages, response_format=fmt, max_tokens=60,
                                                temperature=1.0, seed=seed, stream=True)  # fmt: skip
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == full.choices[0].message.content
    obj = client.chat.completions.create(model=MODEL, messages=messages, response_format={"type": "json_object"},
                                         max_tokens=60, temperature=0.7, seed=1)  # fmt: skip
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    pick = client.completions.create(model=MODEL, prompt="Is the sky green?", max_tokens=8, n=3, temperature=1.0,
                                     extra_body={"structured_outputs": {"choice": ["yes", "no"]}})  # fmt: skip
    assert all(c.text in ("yes", "no") and c.finish_reason == "stop" for c in pick.choices)
    for body, param in (
        ({"structured_outputs": {"regex": "([a-z"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body=body)
        assert info.value.body["param"] == param, info.value.body  # type: ignore[index]


async def test_a_401_keeps_its_connection_usable(server: ServerProcess) -> None:
    """A request refused for its key, body and all, leaves its keep-alive connection able to
    carry the next one (one connection in the pool, so every request reuses it); a 413, whose
    body is not read, says ``Connection: close``."""
    body = json.dumps({"model": MODEL, "prompt": "x" * 2000}).encode()
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60, limits=limits) as http:
        for _ in range(30):
            r = await http.post("/v1/completions", content=body,
                                headers={"Authorization": "Bearer nope", "Content-Type": "application/json"})  # fmt: skip
            assert r.status_code == 401, r.text
            assert "close" not in r.headers.get("connection", "")
            assert (await http.get("/v1/models", headers=AUTH)).status_code == 200
        big = json.dumps({"model": MODEL, "prompt": "x" * 70000}).encode()
        r = await http.post("/v1/completions", content=big, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 413 and r.headers.get("connection") == "close", (r.status_code, r.headers)
        assert (await http.get("/v1/models", headers=AUTH)).status_code == 200


async def test_malformed_requests_while_streaming(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        streams = [asyncio.create_task(_stream(http, _body(12, temperature=0))) for _ in range(4)]
        await asyncio.sleep(0.5)
        for name, body, headers, status, param in MALFORMED:
            r = await http.post(
                "/v1/completions", content=body, headers={**AUTH, **headers, "Content-Type": "application/json"}
            )
            assert r.status_code == status, (name, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"], name
            assert err["code"] == status, name
            if param is not None:
                assert err["param"] == param, (name, err)
            assert r.headers["x-request-id"]
        for events, done in await asyncio.gather(*streams):
            assert done and events[-1]["choices"][0]["finish_reason"] == "length"
            assert "".join(e["choices"][0]["text"] for e in events)
        # Prompts that do not fit say what the limits are.
        r = await http.post("/v1/completions", json={"model": MODEL, "prompt": [2] * 9000}, headers=AUTH)
        assert "9000" in r.json()["error"]["message"] and "8192" in r.json()["error"]["message"]
        assert (await http.get("/nope")).status_code == 404


def test_openapi_fuzz_finds_no_5xx(server: ServerProcess) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode

    doc = httpx.get(server.base_url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    # Keep generation cheap on CPU (few tokens, few choices), and name the served model so
    # that most positive examples reach the engine instead of stopping at a 404.
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = schemas[name]["properties"]
        props["model"] = {"type": "string", "enum": [MODEL]}
        props["max_tokens"] = {"type": "integer", "minimum": 1, "maximum": 4}
        props.pop("max_completion_tokens", None)
        props["n"] = {"type": "integer", "minimum": 1, "maximum": 2}
        schemas[name]["required"] = [*schemas[name].get("required", []), "max_tokens"]
    schema = schemathesis.openapi.from_dict(doc)
    seen: list[int] = []

    def check(mode: GenerationMode, examples: int) -> None:
        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=schema.as_strategy(generation_mode=mode))
        def run(case: Any) -> None:
            response = case.call(base_url=server.base_url, headers=AUTH, timeout=60)
            seen.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, case.body, response.text)

        run()

    check(GenerationMode.POSITIVE, 30)
    check(GenerationMode.NEGATIVE, 30)
    assert any(s == 200 for s in seen) and any(400 <= s < 500 for s in seen)


def test_prefix_cache_metrics_and_admin_flush(server: ServerProcess, client: openai.OpenAI) -> None:
    prompt = "You are a helpful assistant. Answer briefly and precisely. " * 3 + "What is two plus two?"
    for _ in range(2):
        done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    # The repeat reuses every full page (16 tokens) of its prompt but the last token's, in
    # OpenAI's usage.prompt_tokens_details, streamed or not.
    assert done.usage is not None and done.usage.prompt_tokens_details is not None
    expected = (done.usage.prompt_tokens - 1) // 16 * 16
    assert expected > 0 and done.usage.prompt_tokens_details.cached_tokens == expected
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))  # fmt: skip
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == expected
    text = httpx.get(server.base_url + "/metrics").text
    assert metric(text, "aserve_prefix_cache_hit_tokens_total") > 0
    assert metric(text, "aserve_prefix_cached_tokens") > 0
    assert httpx.post(server.base_url + "/admin/flush_cache").status_code == 401
    r = httpx.post(server.base_url + "/admin/flush_cache", headers=AUTH)
    assert r.status_code == 200 and r.json()["flushed_tokens"] > 0
    assert metric(httpx.get(server.base_url + "/metrics").text, "aserve_prefix_cached_tokens") == 0

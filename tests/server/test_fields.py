"""Issue 16's fields against a real `aserve serve` (both shapes: one process, two front ends):
every OpenAI field aserve does not implement is a 400 naming it, list prompts, echo (with
prompt logprobs), vLLM's extra sampling fields on both endpoints, /tokenize and /detokenize,
and SSE keep-alive comments."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.server.helpers import AUTH, MODEL, ServerProcess, parse_sse, running_server

pytestmark = pytest.mark.slow
KEEPALIVE_S = 0.3
CHAT = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module", params=["0", "2"], ids=["one-process", "api-workers-2"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server("--api-workers", request.param, "--sse-keepalive", str(KEEPALIVE_S),
                        log_dir=tmp_path_factory.mktemp("srv")) as srv:  # fmt: skip
        yield srv


def _cmpl(**kw: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 1, **kw}


def _chat(**kw: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 1, **kw}


# (name, (path, body), status, param): each refused field is named in `param`.
REFUSED: list[tuple[str, tuple[str, dict[str, Any]], int, str]] = [
    ("best_of > n", _cmpl(best_of=2), 400, "best_of"),
    ("best_of < n", _cmpl(best_of=1, n=2), 400, "best_of"),
    ("suffix", _cmpl(suffix=" end"), 400, "suffix"),
    ("store", _cmpl(store=True), 400, "store"),
    ("metadata", _chat(metadata={"a": "b"}), 400, "metadata"),
    ("service_tier", _chat(service_tier="flex"), 400, "service_tier"),
    ("audio", _chat(audio={"voice": "alloy", "format": "wav"}), 400, "audio"),
    ("modalities", _chat(modalities=["text", "audio"]), 400, "modalities"),
    ("prediction", _chat(prediction={"type": "content", "content": "x"}), 400, "prediction"),
    ("web_search_options", _chat(web_search_options={}), 400, "web_search_options"),
    ("functions", _chat(functions=[{"name": "f", "parameters": {}}]), 400, "functions"),
    ("function_call", _chat(function_call="auto"), 400, "function_call"),
    ("reasoning_effort", _chat(reasoning_effort="low"), 400, "reasoning_effort"),
    ("verbosity", _chat(verbosity="low"), 400, "verbosity"),
    ("parallel_tool_calls without tools", _chat(parallel_tool_calls=True), 400, "parallel_tool_calls"),
    ("top_logprobs without logprobs", _chat(top_logprobs=2), 400, "top_logprobs"),
    ("unknown field (completions)", _cmpl(frobnicate=1), 400, "frobnicate"),
    ("unknown field (chat)", _chat(frobnicate=1), 400, "frobnicate"),
    ("echo is not a chat field", _chat(echo=True), 400, "echo"),
    ("max_completion_tokens is not a completions field", _cmpl(max_completion_tokens=2), 400, "max_completion_tokens"),
    ("unsupported vLLM field", _cmpl(use_beam_search=True), 400, "use_beam_search"),
    ("stop_token_ids outside the vocabulary", _cmpl(stop_token_ids=[10**9]), 400, "stop_token_ids"),
    ("stop_token_ids not ids", _chat(stop_token_ids=["x"]), 422, "stop_token_ids.0"),
    ("empty prompt list", _cmpl(prompt=[]), 400, "prompt"),
    ("empty prompt in a list", _cmpl(prompt=["a", ""]), 400, "prompt.1"),
    ("bad token id in a list", _cmpl(prompt=[[1, 2], [1, 10**9]]), 400, "prompt"),
    ("too many choices", _cmpl(prompt=["a"] * 65, n=2), 400, "prompt"),
    ("max_tokens 0 in chat", _chat(max_tokens=0), 400, "max_tokens"),
    ("max_completion_tokens 0", _chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    ("vLLM's older guided_* spelling", _chat(guided_choice=["a", "b"]), 400, "guided_choice"),
    ("a tool without a name", _chat(tools=[{"type": "function", "function": {}}]), 400, "tools"),
    ("tool_choice without tools", _chat(tool_choice="required"), 400, "tool_choice"),
    (
        "tool_choice naming a function not offered",
        _chat(
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        ),
        400,
        "tool_choice",
    ),
    # Malformed tool shapes are the client's mistake (they were 500s).
    ("a tool whose function is a string", _chat(tools=[{"type": "function", "function": "x"}]), 400, "tools"),
    (
        "tool_choice whose function is a string",
        _chat(
            tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function", "function": "x"}
        ),
        400,
        "tool_choice",
    ),
    (
        "tool_choice naming a list",
        _chat(
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": ["f"]}},
        ),
        400,
        "tool_choice",
    ),
    (
        "an earlier call whose function is a string",
        _chat(
            messages=[
                *CHAT,
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": "x"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "s"},
            ]
        ),
        400,
        "messages",
    ),
    # Numbers are numbers: strings and booleans are refused, not converted.
    ("temperature as a string", _cmpl(temperature="0.5"), 422, "temperature"),
    ("top_p as a boolean", _cmpl(top_p=True), 422, "top_p"),
    ("a bias as a boolean", _cmpl(logit_bias={"5": True}), 422, "logit_bias.5"),
    ("a bias key that only int() reads", _cmpl(logit_bias={" 100 ": 1}), 400, "logit_bias"),
    # Errors name the field the client sent.
    ("top_logprobs out of range", _chat(logprobs=True, top_logprobs=30), 400, "top_logprobs"),
    ("max_completion_tokens negative", _chat(max_completion_tokens=-5), 400, "max_completion_tokens"),
    ("max_completion_tokens past the context", _chat(max_completion_tokens=10**6), 400, "max_completion_tokens"),
    ("stream_options without stream", _cmpl(stream_options={"include_usage": True}), 400, "stream_options"),
]

# OpenAI's defaults of fields aserve does not implement, the other engineer's pass-through
# fields, and identifiers that change nothing: all 200.
ACCEPTED: list[tuple[str, tuple[str, dict[str, Any]]]] = [
    (
        "defaults (completions)",
        _cmpl(best_of=1, suffix=None, store=False, metadata=None, service_tier="auto", user="u-1", stream_options=None),
    ),
    ("best_of == n", _cmpl(best_of=2, n=2)),
    ("n null (OpenAI's n is nullable)", _cmpl(n=None)),
    (
        "a developer turn (OpenAI's newer system turn)",
        _chat(messages=[{"role": "developer", "content": "Be brief."}, *CHAT]),
    ),
    ("a seed at the top of the range with n = 2", _cmpl(seed=2**63 - 1, n=2, temperature=1.0)),
    (
        "defaults (chat)",
        _chat(
            audio=None,
            modalities=["text"],
            prediction=None,
            web_search_options=None,
            functions=None,
            function_call="none",
            reasoning_effort=None,
            verbosity=None,
            store=False,
            service_tier="default",
            user="u",
            safety_identifier="s",
            prompt_cache_key="k",
        ),
    ),
    (
        "passed through",
        _chat(
            response_format={"type": "text"},
            structured_outputs=None,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
            tool_choice="none",
            parallel_tool_calls=False,
        ),
    ),
]


def test_refused_and_accepted_fields(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, headers=AUTH, timeout=120) as http:
        for name, (path, body), status, param in REFUSED:
            r = http.post(path, json=body)
            assert r.status_code == status, (name, r.text)
            err = r.json()["error"]
            assert err["param"] == param and err["code"] == status and err["message"], (name, err)
            assert err["type"] == "invalid_request_error", (name, err)
        for name, (path, body) in ACCEPTED:
            r = http.post(path, json=body)
            assert r.status_code == 200, (name, r.text)


def test_list_prompts(client: openai.OpenAI, tokenizer: Any) -> None:
    prompts = ["Hello", "The capital of France is"]
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 3, "temperature": 0, "n": 2,
                          "extra_body": {"ignore_eos": True}}  # fmt: skip
    full = client.completions.create(prompt=prompts, **kw)
    assert [c.index for c in full.choices] == [0, 1, 2, 3]
    # Choice i answers prompt i // n: greedy, so each prompt's two choices agree.
    texts = [c.text for c in full.choices]
    assert texts[0] == texts[1] and texts[2] == texts[3]
    alone = client.completions.create(prompt=prompts[1], **{**kw, "n": 1})
    assert alone.choices[0].text == texts[2]
    assert full.usage is not None
    lens = [len(tokenizer.encode(p, add_special_tokens=True)) for p in prompts]
    assert full.usage.prompt_tokens == sum(lens) and full.usage.completion_tokens == 12
    streamed = {i: "" for i in range(4)}
    usage = None
    for chunk in client.completions.create(prompt=prompts, stream=True, stream_options={"include_usage": True}, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.text
        usage = chunk.usage or usage
    assert streamed == dict(enumerate(texts))
    assert usage is not None and usage.prompt_tokens == full.usage.prompt_tokens
    # Token-id lists: a list of them is several prompts, one list of ids is one prompt.
    ids = [tokenizer.encode(p, add_special_tokens=True) for p in prompts]
    by_ids = client.completions.create(prompt=ids, **kw)
    assert [c.text for c in by_ids.choices] == texts
    one = client.completions.create(prompt=ids[1], **kw)
    assert [c.text for c in one.choices] == texts[2:]


def test_echo_and_prompt_logprobs(client: openai.OpenAI, tokenizer: Any) -> None:
    prompt = "The capital of France is"
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, logprobs=1)
    lp = first.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None
    generated_lp = lp.token_logprobs[0]
    echoed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, echo=True)
    assert echoed.choices[0].text.startswith(prompt + first.choices[0].text)
    # The prompt with that token appended, as ids: its last prompt logprob is the one the
    # generation reported for it (prefill logits at the same position).
    ids = tokenizer.encode(prompt, add_special_tokens=True) + tokenizer.encode(first.choices[0].text)[:1]
    kw: dict[str, Any] = {"model": MODEL, "prompt": ids, "max_tokens": 2, "temperature": 0, "echo": True,
                          "logprobs": 2, "extra_body": {"ignore_eos": True}}  # fmt: skip
    full = client.completions.create(**kw)
    choice = full.choices[0]
    assert choice.text.startswith(tokenizer.decode(ids, skip_special_tokens=False))
    lps = choice.logprobs
    assert (
        lps is not None and lps.tokens is not None and lps.token_logprobs is not None and lps.top_logprobs is not None
    )
    assert len(lps.tokens) == len(ids) + 2 == len(lps.token_logprobs) == len(lps.top_logprobs)
    assert lps.token_logprobs[0] is None and lps.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lps.token_logprobs[1:])
    assert abs(lps.token_logprobs[len(ids) - 1] - generated_lp) < 1e-2, (lps.token_logprobs, generated_lp)
    assert all(t is not None and 2 <= len(t) <= 3 for t in lps.top_logprobs[1:])
    # Streamed: the first chunk of the choice carries the prompt and its logprobs.
    chunks = [c for c in client.completions.create(**kw, stream=True) if c.choices]
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    tokens = [t for c in chunks for t in (c.choices[0].logprobs.tokens or [])]  # type: ignore[union-attr]
    assert tokens == lps.tokens


def test_echo_with_max_tokens_zero(client: openai.OpenAI, tokenizer: Any) -> None:
    """echo with max_tokens 0: the prompt and its logprobs, finish "length", no completion
    token; a string, token ids and a list of prompts, streamed and not. The prompt logprobs
    are the ones the same prompt reports when it also generates (checked against
    transformers in tests/engine/test_prompt_logprobs.py), and the last one is the logprob
    the server reported when it generated that token."""
    text = "The capital of France is"
    ids = tokenizer.encode(text, add_special_tokens=True)
    first = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0, logprobs=1)
    assert first.choices[0].logprobs is not None and first.choices[0].logprobs.token_logprobs is not None
    with_next = ids + tokenizer.encode(first.choices[0].text)[:1]
    kw: dict[str, Any] = {"model": MODEL, "echo": True, "logprobs": 2}
    generating = client.completions.create(prompt=with_next, max_tokens=2, temperature=0, **kw).choices[0]
    assert generating.logprobs is not None and generating.logprobs.token_logprobs is not None

    def check(choice: Any, prompt_ids: list[int], echoed: str) -> None:
        assert choice.text == echoed and choice.finish_reason == "length"
        lps = choice.logprobs
        assert lps.tokens == [tokenizer.token_text(t) for t in prompt_ids]
        assert lps.token_logprobs[0] is None and lps.top_logprobs[0] is None
        assert all(t is not None and 2 <= len(t) <= 3 for t in lps.top_logprobs[1:])

    hello = tokenizer.encode("Hello", add_special_tokens=True)

    def decoded(p: list[int]) -> str:
        return str(tokenizer.decode(p, skip_special_tokens=False))

    # (prompt, each prompt's ids, each echoed text): a string, ids, a list of each.
    cases: list[tuple[Any, list[list[int]], list[str]]] = [
        (text, [ids], [text]),
        (with_next, [with_next], [decoded(with_next)]),
        ([text, "Hello"], [ids, hello], [text, "Hello"]),
        ([hello, with_next], [hello, with_next], [decoded(hello), decoded(with_next)]),
    ]
    for prompt, each, echoed in cases:
        whole = client.completions.create(prompt=prompt, max_tokens=0, **kw)
        assert whole.usage is not None and whole.usage.completion_tokens == 0
        assert whole.usage.prompt_tokens == sum(len(e) for e in each)
        for choice, e, t in zip(whole.choices, each, echoed, strict=True):
            check(choice, e, t)
            if e == with_next:
                got = choice.logprobs.token_logprobs  # type: ignore[union-attr]
                want = generating.logprobs.token_logprobs[: len(with_next)]
                assert got[0] is None and want[0] is None
                assert got[1:] == pytest.approx(want[1:], abs=1e-3)  # other batch shapes, other roundings
                assert abs(got[-1] - first.choices[0].logprobs.token_logprobs[0]) < 1e-2  # type: ignore[index]
        chunks = [c for c in client.completions.create(prompt=prompt, max_tokens=0, stream=True,
                                                         stream_options={"include_usage": True}, **kw)]  # fmt: skip
        by_index: dict[int, list[Any]] = {}
        for c in chunks:
            for ch in c.choices:
                by_index.setdefault(ch.index, []).append(ch)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 0
        for i, choice in enumerate(whole.choices):
            (only,) = by_index[i]  # one chunk per choice: the prompt, its logprobs and the end
            assert only.text == choice.text and only.finish_reason == "length"
            streamed, returned = only.logprobs.token_logprobs, choice.logprobs.token_logprobs  # type: ignore[union-attr]
            assert streamed[0] is None and streamed[1:] == pytest.approx(returned[1:], abs=1e-3)
    # Without logprobs: just the prompt back.
    plain = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True)
    assert plain.choices[0].text == text and plain.choices[0].finish_reason == "length"


def _force(tokenizer: Any, piece: str) -> int:
    token = tokenizer.piece_to_id(piece)
    assert token is not None, piece
    return int(token)


def _text(endpoint: str, r: dict[str, Any]) -> str:
    c = r["choices"][0]
    return str(c["text"] if endpoint == "completions" else c["message"]["content"])


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_vllm_sampling_fields(server: ServerProcess, tokenizer: Any, endpoint: str) -> None:
    """stop_token_ids, min_tokens, include_stop_str_in_output, skip_special_tokens and
    logit_bias each change what comes back, on both endpoints."""
    paris = tokenizer.encode(" Paris")[0]
    special = _force(tokenizer, "<start_of_turn>")
    assert tokenizer.is_special(special)

    def ask(**kw: Any) -> dict[str, Any]:
        path, body = (_cmpl if endpoint == "completions" else _chat)(**{"max_tokens": 6, "temperature": 0, **kw})
        r = httpx.post(server.base_url + path, json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        return dict(r.json())

    # logit_bias forces " Paris"; as a stop token id it ends the request at once ...
    r = ask(logit_bias={str(paris): 100}, stop_token_ids=[paris])
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 1
    # ... but not before min_tokens (it is banned until then, so other tokens come first).
    r = ask(logit_bias={str(paris): 100}, stop_token_ids=[paris], min_tokens=3)
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 4
    # A stop string is cut from the text, or kept with include_stop_str_in_output.
    cut = ask(logit_bias={str(paris): 100}, stop=["Paris"], ignore_eos=True)
    kept = ask(logit_bias={str(paris): 100}, stop=["Paris"], ignore_eos=True, include_stop_str_in_output=True)
    assert "Paris" not in _text(endpoint, cut) and _text(endpoint, kept).endswith("Paris")
    # A special token's text appears only with skip_special_tokens=false.
    hidden = ask(logit_bias={str(special): 100}, ignore_eos=True, max_tokens=2)
    shown = ask(logit_bias={str(special): 100}, ignore_eos=True, max_tokens=2, skip_special_tokens=False)
    assert "<start_of_turn>" not in _text(endpoint, hidden)
    assert _text(endpoint, shown) == "<start_of_turn>" * 2


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_return_token_ids(server: ServerProcess, tokenizer: Any, endpoint: str) -> None:
    """vLLM's return_token_ids: each choice carries its generated ids (a stream, each chunk's
    ids; together the non-streamed answer's) and its prompt's ids (a stream: in the choice's
    first chunk only); without it the bodies have no such keys."""
    prompts = ["Hello", "The capital of France is"]
    if endpoint == "completions":
        path, body = _cmpl(prompt=prompts, n=2, max_tokens=5, temperature=0, ignore_eos=True)
        want_prompts = [tokenizer.encode(p, add_special_tokens=True) for p in prompts for _ in range(2)]
    else:
        path, body = _chat(n=2, max_tokens=5, temperature=0, ignore_eos=True)
    with httpx.Client(base_url=server.base_url, headers=AUTH, timeout=120) as http:
        if endpoint == "chat":
            conv = http.post("/tokenize", json={"model": MODEL, "messages": CHAT}).json()["tokens"]
            want_prompts = [conv, conv]
        plain = http.post(path, json=body).json()
        assert all("token_ids" not in c for c in plain["choices"]) and "prompt_token_ids" not in plain
        full = http.post(path, json={**body, "return_token_ids": True}).json()
        raw = http.post(path, json={**body, "return_token_ids": True, "stream": True}).text
    choices = full["choices"]
    assert len(choices) == len(want_prompts)
    for c in choices:
        text = c["text"] if endpoint == "completions" else c["message"]["content"]
        assert len(c["token_ids"]) == 5 and tokenizer.decode(c["token_ids"]) == text
    assert sum(len(c["token_ids"]) for c in choices) == full["usage"]["completion_tokens"]
    if endpoint == "completions":
        assert [c["prompt_token_ids"] for c in choices] == want_prompts
    else:
        assert full["prompt_token_ids"] == want_prompts[0]
    events, done = parse_sse(raw)
    assert done
    streamed: dict[int, list[int]] = {}
    prompt_ids: dict[int, list[list[int]]] = {}
    for ev in events:
        for c in ev["choices"]:
            streamed.setdefault(c["index"], []).extend(c.get("token_ids") or [])
            chunk_prompt = c.get("prompt_token_ids") if endpoint == "completions" else ev.get("prompt_token_ids")
            if chunk_prompt is not None:
                prompt_ids.setdefault(c["index"], []).append(chunk_prompt)
    assert streamed == {c["index"]: c["token_ids"] for c in choices}
    assert prompt_ids == {i: [p] for i, p in enumerate(want_prompts)}


def test_tokenize_detokenize(server: ServerProcess, tokenizer: Any) -> None:
    from aserve.tokenizer.chat import apply_chat_template

    with httpx.Client(base_url=server.base_url, headers=AUTH, timeout=60) as http:
        r = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello world", "return_token_strs": True})
        assert r.status_code == 200, r.text
        doc = r.json()
        ids = tokenizer.encode("Hello world", add_special_tokens=True)
        assert doc["tokens"] == ids and doc["count"] == len(ids) and doc["max_model_len"] == 8192
        assert doc["token_strs"] == [tokenizer.id_to_piece(t) for t in ids]
        plain = http.post("/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}).json()
        assert plain["tokens"] == ids[1:] and plain["token_strs"] is None
        chat = http.post("/tokenize", json={"model": MODEL, "messages": CHAT}).json()
        want = tokenizer.encode(apply_chat_template(tokenizer, CHAT), add_special_tokens=False)
        assert chat["tokens"] == want
        usage = http.post("/v1/chat/completions", json=_chat()[1]).json()["usage"]
        assert usage["prompt_tokens"] == chat["count"]
        # A conversation with tools and tool turns counts as the chat endpoint lays it out.
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        turns = [
            *CHAT,
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                  "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ]  # fmt: skip
        r = http.post("/tokenize", json={"model": MODEL, "messages": turns, "tools": tools})
        assert r.status_code == 200, r.text
        body = {**_chat(messages=turns, tools=tools)[1], "max_tokens": 1}
        assert http.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"] == r.json()["count"]
        r = http.post("/detokenize", json={"model": MODEL, "tokens": ids})
        assert r.status_code == 200 and r.json() == {"prompt": tokenizer.decode(ids, skip_special_tokens=False)}
        for path, body, status, param in [
            ("/tokenize", {"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
            ("/tokenize", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
            ("/tokenize", {"model": MODEL}, 422, "prompt"),
            ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
            ("/detokenize", {"tokens": ["a"]}, 422, "tokens.0"),
        ]:
            r = http.post(path, json=body)
            assert r.status_code == status and r.json()["error"]["param"] == param, (path, body, r.text)
    assert httpx.post(server.base_url + "/tokenize", json={"prompt": "x"}).status_code == 401


def test_sse_keepalive_while_waiting(server: ServerProcess, client: openai.OpenAI) -> None:
    """A prefill keeps the first token waiting for more than a keep-alive interval; the
    stream says `: keep-alive` meanwhile, and the openai client reads through the comments.
    1600 prompt tokens take ~1.4 s on this project's 2-core VM (400 took 0.36-0.39 s, too
    close to the 0.3 s interval: an idle CI machine answered first)."""
    rng = random.Random(len(server.base_url))
    prompt = [rng.randrange(1000, 20000) for _ in range(1600)]  # fresh ids: no prefix cache hit
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, headers=AUTH, timeout=120) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    assert ": keep-alive\n\n" in raw[: raw.index("data: ")], raw[:200]
    events, done = parse_sse(raw)
    assert done and [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
    prompt = [rng.randrange(1000, 20000) for _ in range(1600)]
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, stream=True,
                                            extra_body={"ignore_eos": True}))  # fmt: skip
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

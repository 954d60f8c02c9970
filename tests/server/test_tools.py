"""Tool calling through the official openai client against a real `aserve serve` (default
model, whose template takes no tools: aserve's instruction and JSON format). ``required`` and a
named function are enforced by the grammar engine, so the 270M model's arguments validate
against each function's schema (jsonschema is the judge); ``auto`` may answer either way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from aserve.server.tools import ToolUse, tool_use
from tests.server.helpers import MODEL, ServerProcess, running_server

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "integer", "minimum": -99,
                                                                             "maximum": 99}},
    "required": ["a", "b"],
    "additionalProperties": False,
}  # fmt: skip
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


def _valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


# -- parsing, without a server ---------------------------------------------------------------


def _use(choice: str = "auto") -> ToolUse:
    use = tool_use(TOOLS, choice, None)
    assert use is not None
    return use


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "add", "arguments": {"a": 1, "b": 2}}',
        '  ```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```',
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
        '{"name": "add", "parameters": {"a": 1, "b": 2}}',  # Llama 3's JSON format
        '[{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}]',
    ],
)
def test_calls_parse_from_the_formats_models_use(text: str) -> None:
    reply = _use().parse(text)
    assert reply.content == "" and [c.name for c in reply.calls] == ["add"]
    assert json.loads(reply.calls[0].arguments) == {"a": 1, "b": 2} and reply.calls[0].id.startswith("call_")


@pytest.mark.parametrize(
    "text",
    ["The weather is fine.", '{"name": "unknown", "arguments": {}}', '{"name": "add", "arguments": 3}', "[]", ""],
)
def test_text_that_is_not_a_call_of_an_offered_function_is_content(text: str) -> None:
    reply = _use().parse(text)
    assert reply.calls == [] and reply.content == text


def test_required_and_named_choices_constrain_the_output_to_a_call() -> None:
    required = _use("required").schema()
    assert required is not None and required["type"] == "array" and required["minItems"] == 1
    named = tool_use(TOOLS, {"type": "function", "function": {"name": "add"}}, False)
    assert named is not None and named.schema() == {
        "type": "object", "properties": {"name": {"const": "add"}, "arguments": ADD},
        "required": ["name", "arguments"], "additionalProperties": False,
    }  # fmt: skip
    assert _use("auto").schema() is None and tool_use(TOOLS, "none", None) is None


# -- through the server ------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["0", "2"], ids=["one-process", "api-workers-2"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Both shapes: with front ends, the template, the grammar and the parsing of calls run
    in the front end and the constrained decoding in the core. float32 prefills: a request
    sent again hits the prefix cache, and the default bfloat16 prefill's rounding depends on
    how much of the prompt a step computes (README), which a seeded sample can follow."""
    args = ("--api-workers", request.param, "--gguf-prefill", "float32")
    with running_server(*args, log_dir=tmp_path_factory.mktemp("srv")) as srv:
        yield srv


@pytest.mark.slow
def test_required_tool_calls_validate_streamed_and_not(client: openai.OpenAI) -> None:
    for seed in range(3):
        # One call per reply (parallel_tool_calls false): with a list allowed, the small model
        # tends to keep adding calls until max_tokens.
        kw: Any = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "required",
                   "parallel_tool_calls": False, "max_tokens": 120, "temperature": 0.8, "seed": seed}  # fmt: skip
        full = client.chat.completions.create(**kw)
        choice = full.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        calls = choice.message.tool_calls or []
        assert len(calls) == 1 and all(c.type == "function" and c.id.startswith("call_") for c in calls)
        for c in calls:
            _valid(c.function.name, c.function.arguments)
        # Streamed: the same seed gives the same call, its arguments token by token.
        content, streamed, finish = _stream(client, kw)
        assert content == "" and finish == "tool_calls"
        _same_calls(streamed, calls)


def _stream(client: openai.OpenAI, kw: Any) -> tuple[str, list[tuple[str, str, list[str]]], str | None]:
    """A streamed reply as OpenAI's shape has it: (content, [(id, name, argument pieces)],
    finish_reason). Each call's first delta carries its index, id, type and name (once); the
    later ones only pieces of its arguments."""
    content, finish = "", None
    calls: list[tuple[str, str, list[str]]] = []
    for chunk in client.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            assert d.function is not None
            if d.index == len(calls):
                assert d.id is not None and d.id.startswith("call_") and d.type == "function" and d.function.name
                calls.append((d.id, d.function.name, [d.function.arguments or ""]))
            else:
                assert d.index == len(calls) - 1 and d.id is None and d.function.name is None, d
                calls[-1][2].append(d.function.arguments or "")
    return content, calls, finish


def _same_calls(streamed: list[tuple[str, str, list[str]]], calls: list[Any]) -> None:
    """The streamed pieces of each call's arguments add up to the whole reply's, exactly,
    and they came in more than one piece (as generated, not at the end)."""
    assert [(name, "".join(pieces)) for _, name, pieces in streamed] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    assert all(len([p for p in pieces if p]) > 1 for _, _, pieces in streamed), streamed


@pytest.mark.slow
def test_named_and_auto_tool_calls_stream_their_arguments(client: openai.OpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    kw: Any = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": named, "max_tokens": 60,
               "temperature": 0}  # fmt: skip
    full = client.chat.completions.create(**kw).choices[0]
    assert full.finish_reason == "tool_calls" and full.message.content is None
    calls = full.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    _valid("get_weather", calls[0].function.arguments)
    content, streamed, finish = _stream(client, kw)
    assert content == "" and finish == "tool_calls"
    _same_calls(streamed, calls)
    # auto: whatever the model chooses (call or text), the stream says the same as the reply.
    for seed in range(2):
        kw = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 60,
              "temperature": 0.8, "seed": seed}  # fmt: skip
        full = client.chat.completions.create(**kw).choices[0]
        content, streamed, finish = _stream(client, kw)
        assert finish == full.finish_reason and content == (full.message.content or "")
        assert [(name, "".join(pieces)) for _, name, pieces in streamed] == [
            (c.function.name, c.function.arguments) for c in full.message.tool_calls or []
        ]


@pytest.mark.slow
def test_a_named_function_is_called_and_a_conversation_with_results_continues(client: openai.OpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "add"}}
    ask: Any = [{"role": "user", "content": "What is 2 plus 3?"}]
    out = client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice=named, max_tokens=60,
                                         temperature=0)  # fmt: skip
    calls = out.choices[0].message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "add"
    _valid("add", calls[0].function.arguments)
    turn: Any = [
        *ask,
        {"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "5"},
    ]
    follow = client.chat.completions.create(model=MODEL, messages=turn, tools=TOOLS, max_tokens=24, temperature=0)
    choice = follow.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.finish_reason == "tool_calls":  # auto: a call is allowed, and then it is a valid one's name
        assert all(c.function.name in SCHEMAS for c in choice.message.tool_calls or [])
    else:
        assert isinstance(choice.message.content, str)

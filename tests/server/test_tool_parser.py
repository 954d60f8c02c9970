"""The incremental tool-call parser on hand-written token sequences: fed token by token, and
the same text split at every position, it gives the reply written out by hand below; a call's
name goes out once, before its arguments, which stream as they grow; text without a call
comes out unchanged as content."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aserve.server.tool_parser import Arguments, CallStart, Content, Event, ToolCallParser

FUNCTIONS = ("add", "get_weather")
Reply = tuple[str, list[tuple[str, str]]]


def _run(pieces: Iterable[str]) -> tuple[list[Event], list[list[Event]]]:
    """All events, and the events of each ``feed`` (the last list is ``finish``'s)."""
    parser = ToolCallParser(FUNCTIONS)
    per_feed = [parser.feed(p) for p in pieces]
    per_feed.append(parser.finish())
    return [e for events in per_feed for e in events], per_feed


def _reply(events: list[Event]) -> Reply:
    content = "".join(e.text for e in events if isinstance(e, Content))
    calls: list[tuple[str, str]] = []
    for e in events:
        if isinstance(e, CallStart):
            assert e.index == len(calls) and e.id.startswith("call_")
            calls.append((e.name, ""))
        elif isinstance(e, Arguments):
            name, args = calls[e.index]
            calls[e.index] = (name, args + e.text)
    return content, calls


# (tokens as a model might emit them, the reply they make)
CASES: list[tuple[list[str], Reply]] = [
    (
        [
            '{"',
            "name",
            '":',
            ' "',
            "add",
            '",',
            ' "',
            "arguments",
            '":',
            " {",
            '"a',
            '":',
            " 1",
            ",",
            ' "b',
            '":',
            " 2",
            "}}",
        ],
        ("", [("add", '{"a": 1, "b": 2}')]),
    ),
    (
        [
            "<tool_call>",
            "\n",
            '{"name": "',
            "get",
            "_weather",
            '", "arguments": {"',
            "city",
            '": "',
            "Par",
            "is",
            '"}}',
            "\n",
            "</tool_call>",
        ],
        ("", [("get_weather", '{"city": "Paris"}')]),
    ),
    (
        [
            "Let",
            " me",
            " check",
            ".",
            "\n",
            "<tool",
            "_call",
            ">",
            '{"arguments": {"x": "}',
            "{",
            '"}, ',
            '"name": "add"}',
            "</tool_call>",
            " Done",
            ".",
        ],
        ("Let me check.\n Done.", [("add", '{"x": "}{"}')]),
    ),
    (
        ["  ", "```", "json", "\n", '{"name": "add", "parameters": {"a":', " -3}}", "\n", "```"],
        ("", [("add", '{"a": -3}')]),
    ),
    (
        ["[", '{"name": "add", "arguments": {"a": 1}}', ", ", '{"name": "get_weather"', "}", "]"],
        ("", [("add", '{"a": 1}'), ("get_weather", "{}")]),
    ),
    (
        ['[{"name": "add", "arguments": "', '{\\"a\\": 1', ', \\"s\\": \\"\\u00e9\\ud83d', '\\ude00\\"}', '"}]'],
        ("", [("add", '{"a": 1, "s": "é😀"}')]),
    ),
    # Cut by max_tokens inside the arguments: still a call, with what was written.
    (['{"name": "add", "arguments": {"a": 1', ', "b'], ("", [("add", '{"a": 1, "b')])),
    # Not calls: all of it is content, unchanged.
    (["The", " weather", " is", " fine", "."], ("The weather is fine.", [])),
    (['{"name": "', "unknown", '", "arguments": {}}'], ('{"name": "unknown", "arguments": {}}', [])),
    (['{"name": "add", "arguments": ', "3}"], ('{"name": "add", "arguments": 3}', [])),
    (['{"answer"', ": 42}"], ('{"answer": 42}', [])),
    (["[", "]"], ("[]", [])),
    (["a ", "<", " b ", "<tool", "_c"], ("a < b <tool_c", [])),
    (["x = {", '"name": "add"}'], ('x = {"name": "add"}', [])),
    (["  "], ("  ", [])),
    ([], ("", [])),
]


@pytest.mark.parametrize(("tokens", "expected"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_token_by_token_and_every_split_give_the_reply(tokens: list[str], expected: Reply) -> None:
    events, _ = _run(tokens)
    assert _reply(events) == expected
    text = "".join(tokens)
    assert _reply(_run([text])[0]) == expected
    assert _reply(_run(list(text))[0]) == expected
    for i in range(len(text) + 1):
        assert _reply(_run([text[:i], text[i:]])[0]) == expected, i
        for j in range(i, len(text) + 1, 7):
            assert _reply(_run([text[:i], text[i:j], text[j:]])[0]) == expected, (i, j)
    # Each call's name goes out once, before any of its arguments.
    started: set[int] = set()
    for e in events:
        if isinstance(e, CallStart):
            assert e.index not in started
            started.add(e.index)
        elif isinstance(e, Arguments):
            assert e.index in started


def test_arguments_stream_as_they_are_generated() -> None:
    """Once the name is known and the arguments begin, each token's piece goes out with it."""
    tokens = ['{"name": "get_weather", "arguments": ', "{", '"city"', ": ", '"Paris"', ', "unit": ', '"C"', "}", "}"]
    _, per_feed = _run(tokens)
    assert per_feed[0] == []  # the name, but no arguments yet: held (it could still break)
    assert isinstance(per_feed[1][0], CallStart) and per_feed[1][0].name == "get_weather"
    assert per_feed[1][1:] == [Arguments(0, "{")]
    assert [e.text for events in per_feed[2:8] for e in events if isinstance(e, Arguments)] == tokens[2:8]
    assert per_feed[8] == [] and per_feed[9] == []


def test_content_before_a_call_is_not_held() -> None:
    _, per_feed = _run(["Sure", ", here", " <tool", "_call>", "\n{"])
    assert per_feed[:5] == [[Content("Sure")], [Content(", here")], [Content(" ")], [], []]
    # "<tool" was held until it was the tag; the output ended before the call was one.
    assert per_feed[5] == [Content("<tool_call>\n{")]


ALPHABET = st.sampled_from(
    ["{", "}", "[", "]", '"', ":", ",", " ", "\n", "\\", "name", "arguments", "add", "get_weather", "x", "1",
     "<tool_call>", "</tool_call>", "<", "```", "json", '"name": "add"', '"arguments": {', "\\u00e9"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(ALPHABET, max_size=30), st.lists(st.integers(0, 400), max_size=4))
def test_any_text_any_split_gives_the_same_reply(tokens: list[str], cuts: list[int]) -> None:
    text = "".join(tokens)
    whole = _reply(_run([text])[0])
    bounds = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    assert _reply(_run(pieces)[0]) == whole
    assert _reply(_run(tokens)[0]) == whole
    content, calls = whole
    if not calls:
        assert content == text  # nothing that is not a call is lost or changed

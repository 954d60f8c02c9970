"""Tool calling for chat completions: tools into the prompt, calls out of the output.

A model whose chat template takes ``tools`` (Llama 3.x, Qwen2.5, ...) gets them through the
template and answers in its own format; the calls are parsed from Hermes-style
``<tool_call>{...}</tool_call>`` blocks or from bare JSON. A template without tools (Gemma 3's,
the built-in formats) gets a system instruction that lists the functions and asks for aserve's
format: one JSON object ``{"name": ..., "arguments": {...}}``, or a JSON list of them.

``tool_choice`` ``"required"`` or a named function is enforced with the grammar engine
(structured outputs): the output can only be a call of an offered function whose arguments
match its JSON schema, so even a 270M model returns valid arguments. ``"auto"`` leaves the
choice to the model; output that does not parse as a call of an offered function is content.
Calls are read by one incremental parser (``aserve.server.tool_parser``), so a stream sends
each call's name once and then its arguments as they are generated, and a reply not streamed
is the same parser run over the whole text: its ``arguments`` are the streamed pieces joined.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aserve.errors import InvalidRequestError
from aserve.sampling_params import StructuredOutputs
from aserve.server.tool_parser import CallStart, Content, Event, ToolCallParser


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolUse:
    """A chat request's tools as the server acts on them."""

    functions: dict[str, dict[str, Any]]  # name -> {"name", "description", "parameters"}
    choice: str  # "auto", "required" or a function's name
    parallel: bool

    def schema(self) -> dict[str, Any] | None:
        """The JSON schema the output must match, or None when the model may answer in text."""
        if self.choice == "auto":
            return None

        def call(name: str) -> dict[str, Any]:
            params = self.functions[name].get("parameters") or {"type": "object"}
            return {"type": "object", "properties": {"name": {"const": name}, "arguments": params},
                    "required": ["name", "arguments"], "additionalProperties": False}  # fmt: skip

        if self.choice != "required":
            return call(self.choice)
        any_call = {"anyOf": [call(n) for n in self.functions]}
        if not self.parallel:
            return any_call
        return {"type": "array", "items": any_call, "minItems": 1}

    def constraint(self) -> StructuredOutputs | None:
        schema = self.schema()
        return None if schema is None else StructuredOutputs(json=schema)

    def tool_dicts(self) -> list[dict[str, Any]]:
        """The tools as a chat template expects them (OpenAI's shape)."""
        return [{"type": "function", "function": f} for f in self.functions.values()]

    def instruction(self) -> str:
        """The system text for a template that does not take tools."""
        listing = json.dumps(list(self.functions.values()), ensure_ascii=False)
        many = " or a JSON list of such objects to make several calls" if self.parallel else ""
        ask = "You must call one of them." if self.choice != "auto" else "Call one only when it helps."
        return (
            f"You can call these functions (JSON Schema for their arguments): {listing}\n"
            f"{ask} To call a function, reply with only a JSON object "
            f'{{"name": <function name>, "arguments": <arguments object>}}{many}, and nothing else.'
        )

    def parser(self) -> ToolCallParser:
        """A parser for one reply: its events stream; run over the whole text, ``parse``."""
        return ToolCallParser(self.functions)

    def parse(self, text: str) -> Reply:
        """A whole reply: its calls of offered functions and the text that is not a call."""
        parser = self.parser()
        events = parser.feed(text) + parser.finish()
        return Reply.of(events)


@dataclass(frozen=True)
class Reply:
    """What a reply says: ``content`` (text outside calls; the whole text when there are none)
    and its calls, whose arguments are the concatenation of the streamed pieces."""

    content: str
    calls: list[ToolCall]

    @classmethod
    def of(cls, events: list[Event]) -> Reply:
        content: list[str] = []
        calls: list[ToolCall] = []
        args: list[list[str]] = []
        for e in events:
            if isinstance(e, Content):
                content.append(e.text)
            elif isinstance(e, CallStart):
                calls.append(ToolCall(e.id, e.name, ""))
                args.append([])
            else:
                args[e.index].append(e.text)
        calls = [ToolCall(c.id, c.name, "".join(a)) for c, a in zip(calls, args, strict=True)]
        return cls("".join(content), calls)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def tool_use(tools: list[dict[str, Any]] | None, tool_choice: Any, parallel: bool | None) -> ToolUse | None:
    """The request's tools, checked; None when no tool may be called (no tools, or ``"none"``)."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
        return None
    if tool_choice == "none":
        return None
    functions: dict[str, dict[str, Any]] = {}
    for k, tool in enumerate(tools):
        fn = _function(tool, "tools", f"tools[{k}]")
        name = fn.get("name")
        if tool.get("type") != "function" or not isinstance(name, str) or not name:
            raise InvalidRequestError(f"tools[{k}] must be a function with a name", param="tools")
        if name in functions:
            raise InvalidRequestError(f"tools[{k}]: the function name {name!r} is given twice", param="tools")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise InvalidRequestError(f"tools[{k}].function.parameters must be a JSON schema object", param="tools")
        functions[name] = {key: fn[key] for key in ("name", "description", "parameters") if fn.get(key) is not None}
    if tool_choice in (None, "auto", "required"):
        choice = tool_choice or "auto"
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        choice = _function(tool_choice, "tool_choice", "tool_choice").get("name")
        if not isinstance(choice, str) or choice not in functions:
            raise InvalidRequestError(
                f"tool_choice names {choice!r}, which is not among the tools", param="tool_choice"
            )
    else:
        raise InvalidRequestError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    return ToolUse(functions, choice, parallel is not False)


def messages_for(
    messages: list[dict[str, Any]], use: ToolUse | None, template_takes_tools: bool
) -> list[dict[str, Any]]:
    """The conversation as the template should see it. A template that takes tools gets the
    messages as sent (``tool_calls`` with their arguments parsed, as transformers' templates
    expect); otherwise earlier calls become assistant text in aserve's format, tool results
    user turns, and the tool instruction joins the system message."""
    out: list[dict[str, Any]] = []
    for k, m in enumerate(messages):
        calls = m.get("tool_calls")
        for j, call in enumerate(calls or ()):
            fn = _function(call, "messages", f"messages[{k}].tool_calls[{j}]")
            if not isinstance(fn.get("name"), str):
                raise InvalidRequestError(
                    f"messages[{k}].tool_calls[{j}].function.name must be a string", param="messages"
                )
        if template_takes_tools:
            if calls:
                m = {**m, "tool_calls": [_parsed_arguments(c) for c in calls]}
            out.append(m)
            continue
        if m.get("role") == "assistant" and calls:
            text = json.dumps([_call_json(c) for c in calls], ensure_ascii=False)
            out.append({"role": "assistant", "content": ((m.get("content") or "") + "\n" + text).strip()})
        elif m.get("role") == "tool":
            who = m.get("name") or m.get("tool_call_id") or "the tool"
            out.append({"role": "user", "content": f"Result of {who}: {m.get('content') or ''}"})
        else:
            out.append(m)
    if use is not None and not template_takes_tools:
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{use.instruction()}\n\n{out[0].get('content') or ''}".strip()}
        else:
            out.insert(0, {"role": "system", "content": use.instruction()})
    return out


def _function(obj: Any, param: str, where: str) -> dict[str, Any]:
    """``obj["function"]`` ({} when absent), or the typed error naming ``where`` when ``obj``
    or its function is not a JSON object."""
    fn = obj.get("function") if isinstance(obj, dict) else None
    if not isinstance(obj, dict) or not isinstance(fn, dict | None):
        raise InvalidRequestError(f"{where} must be an object whose function is an object", param=param)
    return fn or {}


def _arguments(call: dict[str, Any]) -> Any:
    """A sent call's arguments, parsed when they are JSON text (as OpenAI sends them)."""
    args = (call.get("function") or {}).get("arguments")
    parsed = _loads(args) if isinstance(args, str) else None
    return args if parsed is None else parsed


def _call_json(call: dict[str, Any]) -> dict[str, Any]:
    return {"name": (call.get("function") or {}).get("name"), "arguments": _arguments(call)}


def _parsed_arguments(call: dict[str, Any]) -> dict[str, Any]:
    args = _arguments(call)
    if not isinstance(args, dict):
        return call
    return {**call, "function": {**(call.get("function") or {}), "arguments": args}}

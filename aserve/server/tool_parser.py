"""Tool calls read out of a model's output as it grows: one parser for streamed and whole replies.

Recognised, as ``aserve.server.tools`` documents them: Hermes blocks
``<tool_call>{...}</tool_call>`` anywhere in the output, and, at the start of the output or
right after a call, a bare JSON call ``{"name": ..., "arguments": {...}}`` (or Llama 3's
``"parameters"``), a JSON list of calls, either one optionally in a ```` ```json ```` fence.
The arguments are an object, or JSON text in a string (some models write them so).

``feed(text)`` returns events in output order: ``Content`` (text that is not a call),
``CallStart`` (once per call: its index, id and name) and ``Arguments`` (the next piece of
that call's arguments as written). A call starts once its name is an offered function and its
arguments have begun (or its object closed without any: ``{}``). Text that may still turn
into a call (the whitespace before it, ``{"name": "ad``, a partial ``<tool_call>``) is held,
and if it does not, all of it goes out as content: an output without calls comes out
unchanged as content. A started call stays a call: if the output is cut (``max_tokens``) its
arguments are what was written, and text after a break in its JSON is content. The reply
not streamed is this parser run over the whole text, so the streamed pieces add up to it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
FENCE = "```"
_WS = " \t\r\n"
_ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    text: str


Event = Content | CallStart | Arguments
_State = Callable[[str], None]


class ToolCallParser:
    """Incremental: ``feed`` each new piece of text, then ``finish`` once at the end."""

    def __init__(self, functions: Collection[str]) -> None:
        self.functions = frozenset(functions)
        self.calls: list[CallStart] = []
        self._out: list[Event] = []
        # Raw text read whose fate is open: content if no call comes of it, else framing.
        self._held: list[str] = []
        self._after_call = False  # only framing (closing tag, whitespace) was read since a call
        self._state: _State = self._top
        # The JSON value of a call (an object, or a list of objects) being read.
        self._closing: str | None = None  # the marker that ends the block (Hermes, fence), if any
        self._in_list = False
        self._calls_in_list = 0
        # The call object being read.
        self._key = ""
        self._name: str | None = None
        self._started = False  # its CallStart went out (its text is no longer held)
        self._has_args = False
        self._pending_args: list[str] = []  # arguments read before the name
        self._depth = 0
        self._in_string = False
        self._escape = ""
        self._raw: list[str] = []  # a JSON string being read (a key or the name)
        self._on_string: Callable[[str], None] = self._got_key
        self._marker = ""
        self._matched = 0
        self._on_marker: Callable[[], None] = self._hermes_open

    # -- the interface ------------------------------------------------------------------

    def feed(self, text: str) -> list[Event]:
        for ch in text:
            self._state(ch)
        return self._take()

    def finish(self) -> list[Event]:
        """The end of the output: held text becomes content, unless it is only the framing
        after a call (whitespace, a closing tag cut short)."""
        if self._held and not self._after_call and not self._started:
            self._content_out("".join(self._held))
        self._held.clear()
        self._state = self._done
        return self._take()

    # -- output ---------------------------------------------------------------------------

    def _take(self) -> list[Event]:
        merged: list[Event] = []
        for e in self._out:
            last = merged[-1] if merged else None
            if isinstance(e, Content) and isinstance(last, Content):
                merged[-1] = Content(last.text + e.text)
            elif isinstance(e, Arguments) and isinstance(last, Arguments) and last.index == e.index:
                merged[-1] = Arguments(e.index, last.text + e.text)
            else:
                merged.append(e)
        self._out = []
        return merged

    def _content_out(self, text: str) -> None:
        if text:
            self._out.append(Content(text))

    def _hold(self, ch: str) -> None:
        if not self._started:
            self._held.append(ch)

    def _args_out(self, text: str, raw: str | None = None) -> None:
        """The next piece of the arguments (``raw``: as written, when that differs)."""
        self._has_args = True
        if self._started:
            self._out.append(Arguments(len(self.calls) - 1, text))
        else:
            self._held.append(text if raw is None else raw)
            self._pending_args.append(text)

    def _start_call(self) -> None:
        """The call is one: its name and the arguments read so far go out, its framing is dropped."""
        assert self._name is not None
        call = CallStart(len(self.calls), f"call_{uuid.uuid4().hex[:24]}", self._name)
        self.calls.append(call)
        self._out.append(call)
        self._started = True
        self._held.clear()
        if self._pending_args:
            self._out.append(Arguments(call.index, "".join(self._pending_args)))
            self._pending_args.clear()

    def _not_a_call(self, ch: str | None) -> None:
        """What was held is content after all; go on as content (with ``ch``, not yet read)."""
        self._content_out("".join(self._held))
        self._held.clear()
        self._pending_args.clear()
        self._started = False
        self._after_call = False
        self._state = self._content
        if ch is not None:
            self._content(ch)

    # -- between calls ------------------------------------------------------------------

    def _top(self, ch: str) -> None:
        """The start of the output, or right after a call: a call may begin here."""
        if ch in _WS:
            self._held.append(ch)
        elif ch in "{[":
            self._begin_value(None)
            self._value_start(ch)
        elif ch == HERMES_OPEN[0]:
            self._match(ch, HERMES_OPEN, self._hermes_open)
        elif ch == FENCE[0]:
            self._match(ch, FENCE, self._fence_open)
        else:
            self._not_a_call(ch)

    def _content(self, ch: str) -> None:
        """Plain text; only a Hermes block can start a call from here."""
        if ch == HERMES_OPEN[0]:
            self._match(ch, HERMES_OPEN, self._hermes_open)
        else:
            self._content_out(ch)

    def _done(self, ch: str) -> None:
        raise AssertionError("text fed after finish()")

    def _match(self, ch: str, marker: str, on_match: Callable[[], None]) -> None:
        self._held.append(ch)
        self._marker, self._matched, self._on_marker = marker, 1, on_match
        self._state = self._matching

    def _matching(self, ch: str) -> None:
        if ch != self._marker[self._matched]:
            self._not_a_call(ch)  # not the marker: what was matched so far is content
            return
        self._held.append(ch)
        self._matched += 1
        if self._matched == len(self._marker):
            self._on_marker()

    def _hermes_open(self) -> None:
        self._begin_value(HERMES_CLOSE)
        self._state = self._value_start

    def _fence_open(self) -> None:
        self._begin_value(FENCE)
        self._state = self._fence_language

    def _fence_language(self, ch: str) -> None:
        if ch.isalnum() or ch in _WS:  # ```json and the line break after it
            self._held.append(ch)
        elif ch in "{[":
            self._value_start(ch)
        else:
            self._not_a_call(ch)

    # -- a call's JSON value: an object or a list of them -----------------------------------

    def _begin_value(self, closing: str | None) -> None:
        self._closing, self._in_list, self._calls_in_list = closing, False, 0
        self._after_call = False

    def _value_start(self, ch: str) -> None:
        if ch in _WS:
            self._held.append(ch)
        elif ch == "[" and not self._in_list:
            self._held.append(ch)
            self._in_list = True
            self._state = self._list_item
        elif ch == "{":
            self._object_start(ch)
        else:
            self._not_a_call(ch)

    def _list_item(self, ch: str) -> None:
        if ch in _WS:
            self._hold(ch)
        elif ch == "{":
            self._object_start(ch)
        else:
            self._not_a_call(ch)  # "[]", or a list of something else

    def _list_after(self, ch: str) -> None:
        if ch in _WS:
            return
        if ch == ",":
            self._state = self._list_item
        elif ch == "]":
            self._value_done()
        else:
            self._not_a_call(ch)

    def _value_done(self) -> None:
        self._after_call = True
        self._held.clear()
        if self._closing is None:
            self._state = self._top
        else:
            self._state = self._closing_start

    def _closing_start(self, ch: str) -> None:
        if ch in _WS:
            self._held.append(ch)
        elif self._closing is not None and ch == self._closing[0]:
            self._match(ch, self._closing, self._closed)
        else:
            self._after_call = False
            self._not_a_call(ch)  # no closing tag: what follows is content

    def _closed(self) -> None:
        self._held.clear()
        self._state = self._top

    # -- a call object ------------------------------------------------------------------------

    def _object_start(self, ch: str) -> None:
        self._name, self._started, self._has_args = None, False, False
        self._pending_args.clear()
        self._held.append(ch)
        self._state = self._key_start

    def _key_start(self, ch: str) -> None:
        if ch in _WS:
            self._hold(ch)
        elif ch == '"':
            self._hold(ch)
            self._read_string(self._got_key)
        elif ch == "}":
            self._hold(ch)
            self._object_end()
        else:
            self._fail(ch)

    def _got_key(self, key: str) -> None:
        self._key = key
        self._state = self._colon

    def _colon(self, ch: str) -> None:
        if ch in _WS:
            self._hold(ch)
        elif ch == ":":
            self._hold(ch)
            self._state = self._value_of_key
        else:
            self._fail(ch)

    def _value_of_key(self, ch: str) -> None:
        if ch in _WS:
            self._hold(ch)
            return
        key = self._key
        if key == "name" and ch == '"' and self._name is None:
            self._hold(ch)
            self._read_string(self._got_name)
        elif key in _ARGUMENT_KEYS and not self._has_args and ch in '{"':
            # The arguments begin: with the name known, the call is one from here on.
            self._depth, self._in_string, self._escape = 0, False, ""
            if ch == '"':
                self._hold(ch)  # the quote is framing; the string's text is the arguments
            if self._name is not None:
                self._start_call()
            if ch == "{":
                self._state = self._arguments_object
                self._arguments_object(ch)
            else:
                self._state = self._arguments_string
        else:
            self._fail(ch)  # another key, arguments that are not an object, a second name

    def _got_name(self, name: str) -> None:
        if name not in self.functions:
            self._fail(None)
            return
        self._name = name
        if self._has_args:
            self._start_call()  # the arguments came first: they go out now
        self._state = self._after_member

    def _after_member(self, ch: str) -> None:
        if ch in _WS:
            self._hold(ch)
        elif ch == ",":
            self._hold(ch)
            self._state = self._key_start
        elif ch == "}":
            self._hold(ch)
            self._object_end()
        else:
            self._fail(ch)

    def _object_end(self) -> None:
        if self._name is None:
            self._fail(None)
            return
        if not self._has_args:
            self._pending_args.append("{}")  # a call without arguments: an empty object
            self._has_args = True
        if not self._started:
            self._start_call()
        self._started = False  # the next object's text is held again until it is a call
        if self._in_list:
            self._calls_in_list += 1
            self._state = self._list_after
        else:
            self._value_done()

    def _fail(self, ch: str | None) -> None:
        """The JSON is not (or no longer) a call: held text and ``ch`` are content."""
        self._after_call = False
        self._not_a_call(ch)

    # -- JSON strings and the arguments ---------------------------------------------------------

    def _read_string(self, on_done: Callable[[str], None]) -> None:
        self._raw, self._escape, self._on_string = [], "", on_done
        self._state = self._string

    def _string(self, ch: str) -> None:
        self._hold(ch)
        if self._escape:
            self._escape = ""
            self._raw.append(ch)
        elif ch == "\\":
            self._escape = ch
            self._raw.append(ch)
        elif ch == '"':
            try:
                value = json.loads('"' + "".join(self._raw) + '"')
            except ValueError:
                self._fail(None)
                return
            self._on_string(value)
        else:
            self._raw.append(ch)

    def _arguments_object(self, ch: str) -> None:
        """The arguments as written, to the brace that closes them."""
        self._args_out(ch)
        if self._in_string:
            if self._escape:
                self._escape = ""
            elif ch == "\\":
                self._escape = ch
            elif ch == '"':
                self._in_string = False
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            if self._depth == 0:
                self._state = self._after_member

    def _arguments_string(self, ch: str) -> None:
        """Arguments written as JSON text in a string: its decoded text, escape by escape."""
        if self._escape:
            self._escape += ch
            if not self._escape_complete():
                return
            raw, self._escape = self._escape, ""
            try:
                text = json.loads('"' + raw + '"')
            except ValueError:
                self._hold(raw)
                self._fail(None)
                return
            self._args_out(text, raw)
        elif ch == "\\":
            self._escape = ch
        elif ch == '"':
            self._hold(ch)
            self._state = self._after_member
        else:
            self._args_out(ch)

    def _escape_complete(self) -> bool:
        e = self._escape
        if len(e) < 2 or e[1] != "u":
            return len(e) >= 2
        if len(e) < 6:
            return False
        # A high surrogate needs its low half (\ud83d\ude00) to make one character.
        high = e[2:6].lower()
        if len(high) == 4 and "d800" <= high <= "dbff":
            return len(e) >= 12
        return True

"""Turn engine outputs (results, deltas, logprobs) into OpenAI response objects and stream chunks."""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from aserve.outputs import CompletionResult, Delta, TokenLogprob, Usage
from aserve.server.responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    DeltaMessage,
    PromptTokensDetails,
    ResponseMessage,
    TokenLogprobInfo,
    TopLogprob,
    UsageInfo,
)
from aserve.server.tool_parser import CallStart, Content, Event, ToolCallParser
from aserve.server.tools import ToolUse
from aserve.tokenizer.tokenizer import Tokenizer


def usage_info(usage: Usage) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
    )


def token_text(tok: Tokenizer, token_id: int) -> str:
    return tok.token_text(token_id)  # a byte-level piece ("Ġworld") is shown as its text


@dataclass(frozen=True)
class PromptIds:
    """Each choice's prompt ids (for ``return_token_ids`` and ``echo``); choice ``i`` belongs
    to prompt ``i // n``."""

    ids: list[list[int]]
    n: int

    def of(self, index: int) -> list[int]:
        return self.ids[index // self.n]


@dataclass(frozen=True)
class Echo(PromptIds):
    """What ``echo`` puts before each choice: its prompt's text (and tokens, for logprobs)."""

    texts: list[str]
    decoded: list[bool]  # the text is the ids decoded with their special tokens (an ids prompt)

    def text(self, index: int) -> str:
        return self.texts[index // self.n]


def _json(value: str) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def _int_list(values: Sequence[int]) -> bytes:
    return b"[" + ",".join(map(str, values)).encode() + b"]"


class TextOffsets:
    """Where each token of a choice starts in the choice's ``text``: the characters of the
    decoded text before it. A special token adds none (the text skips it); a byte-fallback
    token adds a character only once its character is complete. One per choice, fed every
    token in order (the echoed prompt's first), across a stream's chunks."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.chars = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def take(self, token_id: int, keep_special: bool = False) -> int:
        """``token_id``'s offset; moves past it (past a special token's text only where the
        text keeps it: ``keep_special``)."""
        at = self.chars
        if keep_special or not self.tok.is_special(token_id):
            self.chars += len(self._utf8.decode(self.tok.piece_bytes(token_id)))
        return at


def echo_logprobs(
    tok: Tokenizer, echo: Echo, index: int, lps: Sequence[TokenLogprob | None] | None, offsets: TextOffsets
) -> CompletionLogprobs:
    """The prompt's part of choice ``index``'s logprobs: the first token has none (nothing
    precedes it), as OpenAI and vLLM report; each position's alternatives include its token."""
    out = CompletionLogprobs()
    keep_special = echo.decoded[index // echo.n]
    for k, token in enumerate(echo.of(index)):
        lp = lps[k] if lps is not None and k < len(lps) else None
        text = token_text(tok, token)
        out.tokens.append(text)
        out.text_offset.append(offsets.take(token, keep_special))
        if lp is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
        else:
            top = {token_text(tok, t): v for t, v in lp.top}
            top.setdefault(text, lp.logprob)
            out.token_logprobs.append(lp.logprob)
            out.top_logprobs.append(top)
    return out


def completion_logprobs(
    tok: Tokenizer, lps: Sequence[TokenLogprob], offsets: TextOffsets, head: CompletionLogprobs | None = None
) -> CompletionLogprobs:
    """Generated tokens' logprobs, after ``head`` (an echoed prompt's, whose tokens
    ``offsets`` has taken) when given."""
    out = CompletionLogprobs() if head is None else head
    for lp in lps:
        out.tokens.append(token_text(tok, lp.token_id))
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append({token_text(tok, t): v for t, v in lp.top})
        out.text_offset.append(offsets.take(lp.token_id))
    return out


def chat_logprobs(tok: Tokenizer, lps: Sequence[TokenLogprob]) -> ChatLogprobs:
    content = []
    for lp in lps:
        text = token_text(tok, lp.token_id)
        tops = [TopLogprob(token=(s := token_text(tok, t)), logprob=v, bytes=list(s.encode())) for t, v in lp.top]
        content.append(TokenLogprobInfo(token=text, logprob=lp.logprob, bytes=list(text.encode()), top_logprobs=tops))
    return ChatLogprobs(content=content)


def completion_response(
    tok: Tokenizer,
    rid: str,
    model: str,
    result: CompletionResult,
    want_logprobs: bool,
    echo: Echo | None = None,
    ids: PromptIds | None = None,
) -> CompletionResponse:
    choices = []
    for o in result.outputs:
        lps = None
        if want_logprobs:
            offsets = TextOffsets(tok)
            head = None if echo is None else echo_logprobs(tok, echo, o.index, o.prompt_logprobs, offsets)
            lps = completion_logprobs(tok, o.logprobs or (), offsets, head)
        text = o.text if echo is None else echo.text(o.index) + o.text
        choice = CompletionChoice(index=o.index, text=text, logprobs=lps, finish_reason=o.finish_reason)
        if ids is not None:
            choice.prompt_token_ids, choice.token_ids = ids.of(o.index), list(o.token_ids)
        choices.append(choice)
    return CompletionResponse(id=rid, model=model, choices=choices, usage=usage_info(result.usage))


def chat_response(
    tok: Tokenizer,
    rid: str,
    model: str,
    result: CompletionResult,
    want_logprobs: bool,
    tools: ToolUse | None = None,
    ids: PromptIds | None = None,
) -> ChatCompletionResponse:
    choices = []
    for o in result.outputs:
        message = ResponseMessage(content=o.text)
        finish: str | None = o.finish_reason
        reply = tools.parse(o.text) if tools is not None else None
        if reply is not None and reply.calls:
            # As streamed (ChatChunks): a call cut by max_tokens is still a call, with finish "length".
            message = ResponseMessage(content=reply.content or None, tool_calls=[c.as_dict() for c in reply.calls])
            finish = "tool_calls" if finish == "stop" else finish
        lps = chat_logprobs(tok, o.logprobs or ()) if want_logprobs else None
        token_ids = None if ids is None else list(o.token_ids)
        choices.append(ChatChoice(index=o.index, message=message, logprobs=lps, finish_reason=finish,
                                  token_ids=token_ids))  # fmt: skip
    response = ChatCompletionResponse(id=rid, model=model, choices=choices, usage=usage_info(result.usage))
    if ids is not None:
        response.prompt_token_ids = ids.of(0)  # a chat request has one prompt: the conversation
    return response


class CompletionChunks:
    """The SSE chunks of a streamed /v1/completions (``echo`` in each choice's first one)."""

    def __init__(
        self,
        tok: Tokenizer,
        rid: str,
        model: str,
        want_logprobs: bool,
        echo: Echo | None = None,
        ids: PromptIds | None = None,
    ) -> None:
        self.tok, self.rid, self.model, self.want_logprobs, self.echo = tok, rid, model, want_logprobs, echo
        self.ids = ids
        self.offsets: dict[int, TextOffsets] = {}  # by choice, from its first chunk
        # A plain chunk (no logprobs or echo; token ids or not) is rendered from these pieces,
        # not through pydantic: the same JSON as CompletionResponse's, ~1 us against ~5 a chunk.
        self._plain = not want_logprobs and echo is None
        self._head = b'data: {"id":' + _json(rid) + b',"object":"text_completion","created":'
        self._model = b',"model":' + _json(model) + b',"choices":[{"index":'

    def opening(self) -> list[BaseModel]:
        return []

    def delta(self, d: Delta) -> BaseModel | bytes:
        if self._plain:
            finish = b"null" if d.finish_reason is None else _json(d.finish_reason)
            ids = b""
            if self.ids is not None:
                if d.index not in self.offsets:
                    self.offsets[d.index] = TextOffsets(self.tok)
                    ids = b',"prompt_token_ids":' + _int_list(self.ids.of(d.index))
                ids += b',"token_ids":' + _int_list(d.token_ids)
            return b"".join((self._head, str(int(time.time())).encode(), self._model, str(d.index).encode(),
                             b',"text":', _json(d.text), b',"logprobs":null,"finish_reason":', finish, ids,
                             b'}],"usage":null}\n\n'))  # fmt: skip
        lps = None
        text = d.text
        first = d.index not in self.offsets
        offsets = self.offsets.setdefault(d.index, TextOffsets(self.tok))
        if self.want_logprobs:
            head = None
            if first and self.echo is not None:
                head = echo_logprobs(self.tok, self.echo, d.index, d.prompt_logprobs, offsets)
            lps = completion_logprobs(self.tok, d.logprobs or (), offsets, head)
        if first and self.echo is not None:
            text = self.echo.text(d.index) + text
        choice = CompletionChoice(index=d.index, text=text, logprobs=lps, finish_reason=d.finish_reason)
        if self.ids is not None:
            choice.token_ids = list(d.token_ids)
            if first:
                choice.prompt_token_ids = self.ids.of(d.index)
        return CompletionResponse(id=self.rid, model=self.model, choices=[choice])

    def usage(self, usage: Usage) -> BaseModel:
        return CompletionResponse(id=self.rid, model=self.model, choices=[], usage=usage_info(usage))


class ChatChunks:
    """The SSE chunks of a streamed /v1/chat/completions (a role chunk first). With tools, each
    choice's text goes through its own tool-call parser: text that is not a call streams as
    content; a call's first delta carries its index, id and name, and the next ones the pieces
    of its arguments as they are generated (as OpenAI and vLLM stream them)."""

    def __init__(
        self,
        tok: Tokenizer,
        rid: str,
        model: str,
        n: int,
        want_logprobs: bool,
        tools: ToolUse | None = None,
        ids: PromptIds | None = None,
    ) -> None:
        self.tok, self.rid, self.model, self.n, self.want_logprobs = tok, rid, model, n, want_logprobs
        self.tools = tools
        self.ids = ids
        self.parsers: dict[int, ToolCallParser] = {}
        self.held_ids: dict[int, list[int]] = {}  # return_token_ids of deltas held by a tool parser

    def _chunk(self, choices: list[ChatChunkChoice], **kw: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.rid, model=self.model, choices=choices, **kw)

    def opening(self) -> list[BaseModel]:
        # OpenAI's first chunk of each choice carries only the role.
        chunks: list[BaseModel] = []
        for i in range(self.n):
            chunk = self._chunk([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))])
            if self.ids is not None:
                chunk.prompt_token_ids = self.ids.of(i)
            chunks.append(chunk)
        return chunks

    def delta(self, d: Delta) -> BaseModel | None:
        lps = chat_logprobs(self.tok, d.logprobs or ()) if self.want_logprobs else None
        msg = DeltaMessage(content=d.text)
        finish: str | None = d.finish_reason
        if self.tools is not None:
            parser = self.parsers.get(d.index)
            if parser is None:
                parser = self.parsers[d.index] = self.tools.parser()
            events = parser.feed(d.text)
            if finish is not None:
                events += parser.finish()
                if parser.calls and finish == "stop":
                    finish = "tool_calls"
            tool_msg = _tool_delta(events)
            if tool_msg is None and finish is None and not lps:
                if self.ids is not None:
                    self.held_ids.setdefault(d.index, []).extend(d.token_ids)  # sent with the next chunk
                return None  # held: it may still become a call
            msg = tool_msg or DeltaMessage()
        choice = ChatChunkChoice(index=d.index, delta=msg, logprobs=lps, finish_reason=finish)
        if self.ids is not None:
            choice.token_ids = self.held_ids.pop(d.index, []) + list(d.token_ids)
        return self._chunk([choice])

    def usage(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage=usage_info(usage))


def _tool_delta(events: list[Event]) -> DeltaMessage | None:
    """A parser's events as one delta: the content, and OpenAI's ``tool_calls`` entries (a
    call's first with its id and name, then ``{"index", "function": {"arguments"}}`` pieces)."""
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    for e in events:
        if isinstance(e, Content):
            content.append(e.text)
        elif isinstance(e, CallStart):
            calls.append(
                {"index": e.index, "id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}}
            )
        elif calls and calls[-1]["index"] == e.index:
            calls[-1]["function"]["arguments"] += e.text
        else:
            calls.append({"index": e.index, "function": {"arguments": e.text}})
    if not content and not calls:
        return None
    return DeltaMessage(content="".join(content) if content else None, tool_calls=calls or None)

"""Turn engine outputs (results, deltas, logprobs) into OpenAI response objects."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aserve.outputs import CompletionResult, TokenLogprob, Usage
from aserve.server.protocol import (
    ChatChoice,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    PromptTokensDetails,
    ResponseMessage,
    TokenLogprobInfo,
    TopLogprob,
    UsageInfo,
)
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
class Echo:
    """What ``echo`` puts before each choice: its prompt's text (and tokens, for logprobs);
    choice ``i`` belongs to prompt ``i // n``."""

    texts: list[str]
    ids: list[list[int]]
    n: int

    def text(self, index: int) -> str:
        return self.texts[index // self.n]

    def prompt_ids(self, index: int) -> list[int]:
        return self.ids[index // self.n]


def echo_logprobs(
    tok: Tokenizer, prompt_ids: Sequence[int], lps: Sequence[TokenLogprob | None] | None
) -> CompletionLogprobs:
    """The prompt's part of an echoed choice's logprobs: the first token has none (nothing
    precedes it), as OpenAI and vLLM report; each position's alternatives include its token."""
    out = CompletionLogprobs()
    offset = 0
    for k, token in enumerate(prompt_ids):
        lp = lps[k] if lps is not None and k < len(lps) else None
        text = token_text(tok, token)
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
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
    tok: Tokenizer, lps: Sequence[TokenLogprob], offset: int = 0, head: CompletionLogprobs | None = None
) -> CompletionLogprobs:
    """Generated tokens' logprobs, after ``head`` (an echoed prompt's) when given."""
    out = CompletionLogprobs()
    if head is not None:
        out = head.model_copy(deep=True)
        offset += out.text_offset[-1] + len(out.tokens[-1]) if out.tokens else 0
    for lp in lps:
        text = token_text(tok, lp.token_id)
        out.tokens.append(text)
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append({token_text(tok, t): v for t, v in lp.top})
        out.text_offset.append(offset)
        offset += len(text)
    return out


def chat_logprobs(tok: Tokenizer, lps: Sequence[TokenLogprob]) -> ChatLogprobs:
    content = []
    for lp in lps:
        text = token_text(tok, lp.token_id)
        tops = [TopLogprob(token=(s := token_text(tok, t)), logprob=v, bytes=list(s.encode())) for t, v in lp.top]
        content.append(TokenLogprobInfo(token=text, logprob=lp.logprob, bytes=list(text.encode()), top_logprobs=tops))
    return ChatLogprobs(content=content)


def completion_response(
    tok: Tokenizer, rid: str, model: str, result: CompletionResult, want_logprobs: bool, echo: Echo | None = None
) -> CompletionResponse:
    choices = []
    for o in result.outputs:
        lps = None
        if want_logprobs:
            head = None if echo is None else echo_logprobs(tok, echo.prompt_ids(o.index), o.prompt_logprobs)
            lps = completion_logprobs(tok, o.logprobs or (), head=head)
        text = o.text if echo is None else echo.text(o.index) + o.text
        choices.append(CompletionChoice(index=o.index, text=text, logprobs=lps, finish_reason=o.finish_reason))
    return CompletionResponse(id=rid, model=model, choices=choices, usage=usage_info(result.usage))


def chat_response(
    tok: Tokenizer, rid: str, model: str, result: CompletionResult, want_logprobs: bool, tools: ToolUse | None = None
) -> ChatCompletionResponse:
    choices = []
    for o in result.outputs:
        message, finish = ResponseMessage(content=o.text), str(o.finish_reason) if o.finish_reason else None
        calls = tools.parse(o.text) if tools is not None and finish == "stop" else None
        if calls:
            message, finish = ResponseMessage(content=None, tool_calls=[c.as_dict() for c in calls]), "tool_calls"
        lps = chat_logprobs(tok, o.logprobs or ()) if want_logprobs else None
        choices.append(ChatChoice(index=o.index, message=message, logprobs=lps, finish_reason=finish))
    return ChatCompletionResponse(id=rid, model=model, choices=choices, usage=usage_info(result.usage))

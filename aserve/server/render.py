"""Turn engine outputs (results, deltas, logprobs) into OpenAI response objects."""

from __future__ import annotations

from collections.abc import Sequence

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


def completion_logprobs(tok: Tokenizer, lps: Sequence[TokenLogprob], offset: int = 0) -> CompletionLogprobs:
    out = CompletionLogprobs()
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
    tok: Tokenizer, rid: str, model: str, result: CompletionResult, want_logprobs: bool
) -> CompletionResponse:
    choices = [
        CompletionChoice(
            index=o.index,
            text=o.text,
            logprobs=completion_logprobs(tok, o.logprobs or ()) if want_logprobs else None,
            finish_reason=o.finish_reason,
        )
        for o in result.outputs
    ]
    return CompletionResponse(id=rid, model=model, choices=choices, usage=usage_info(result.usage))


def chat_response(
    tok: Tokenizer, rid: str, model: str, result: CompletionResult, want_logprobs: bool
) -> ChatCompletionResponse:
    choices = [
        ChatChoice(
            index=o.index,
            message=ResponseMessage(content=o.text),
            logprobs=chat_logprobs(tok, o.logprobs or ()) if want_logprobs else None,
            finish_reason=o.finish_reason,
        )
        for o in result.outputs
    ]
    return ChatCompletionResponse(id=rid, model=model, choices=choices, usage=usage_info(result.usage))

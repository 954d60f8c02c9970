"""OpenAI-compatible request and response models (pydantic), and their mapping to SamplingParams.

Field names follow the OpenAI API so that unmodified clients work. Unknown fields are
ignored, as OpenAI does, so newer client libraries that send extra options keep working.
Range checks live in :class:`aserve.SamplingParams`, the one place that knows the engine's
limits; the models here only check shapes and types.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from aserve.errors import InvalidRequestError
from aserve.sampling_params import SamplingParams, StructuredOutputs

# Without a max_tokens the OpenAI API generates to the end of the context; a server that
# did that on every bare request would be trivially overloaded, so default to a modest cap.
DEFAULT_MAX_TOKENS = 256

# `StrictInt` keeps JSON floats and strings out of integer fields: OpenAI rejects
# `"max_tokens": "5"` too. Floats accept ints, as JSON does not distinguish them.
TokenIds = list[Annotated[StrictInt, Field(ge=0)]]


def _documented(default: Any = None, **bounds: float) -> Any:
    """A field whose bounds appear in the OpenAPI schema but are enforced by SamplingParams.

    SamplingParams stays the single validator (its messages name the parameter and the
    engine's limits); the schema only tells clients and fuzzers what is accepted.
    """
    return Field(default, json_schema_extra=dict(bounds))


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: StrictBool | None = False


class JsonSchemaFormat(_Request):
    name: str | None = None
    description: str | None = None
    # `schema` shadows a BaseModel attribute name, hence the alias.
    schema_: dict[str, Any] = Field(alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Request):
    """OpenAI's ``response_format``: free text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(_Request):
    """vLLM's ``structured_outputs`` extension (aserve's one convention): set exactly one."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: StrictBool | None = None


class _SamplingFields(_Request):
    """Options shared by completions and chat completions."""

    model: str
    max_tokens: StrictInt | None = _documented(minimum=1)
    n: StrictInt = _documented(1, minimum=1, maximum=64)
    stop: str | list[str] | None = None
    seed: StrictInt | None = _documented(minimum=-(2**63), maximum=2**63 - 1)
    temperature: float | None = _documented(minimum=0, maximum=2)
    top_p: float | None = _documented(exclusiveMinimum=0, maximum=1)
    top_k: StrictInt | None = _documented(minimum=-1)
    min_p: float | None = _documented(minimum=0, exclusiveMaximum=1)
    frequency_penalty: float | None = _documented(minimum=-2, maximum=2)
    presence_penalty: float | None = _documented(minimum=-2, maximum=2)
    repetition_penalty: float | None = _documented(exclusiveMinimum=0, maximum=10)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool | None = False
    logit_bias: dict[str, float] | None = None  # token id (as a string, as OpenAI sends it) -> bias
    min_tokens: StrictInt | None = _documented(minimum=0)  # vLLM's extension: no stop before this many
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None  # vLLM's extension
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        stop: tuple[str, ...]
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            seed=self.seed,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            frequency_penalty=self.frequency_penalty or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            stop=stop,
            ignore_eos=bool(self.ignore_eos),
            logprobs=logprobs,
            n=self.n,
            logit_bias=_token_bias(self.logit_bias),
            min_tokens=self.min_tokens or 0,
            structured_outputs=self._structured(),
        )

    def _structured(self) -> StructuredOutputs | None:
        """``response_format`` or ``structured_outputs`` as the engine's constraint (not both)."""
        fmt, so = self.response_format, self.structured_outputs
        if fmt is not None and fmt.type != "text" and so is not None:
            raise InvalidRequestError(
                "give either response_format or structured_outputs, not both", param="structured_outputs"
            )
        if so is not None:
            return StructuredOutputs(json=so.json_, regex=so.regex, grammar=so.grammar,
                                     choice=None if so.choice is None else tuple(so.choice),
                                     json_object=bool(so.json_object))  # fmt: skip
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutputs(json_object=True)
        if fmt.json_schema is None:
            raise InvalidRequestError(
                "response_format of type json_schema needs a json_schema object", param="response_format"
            )
        return StructuredOutputs(json=fmt.json_schema.schema_)


def _token_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` (keys are token ids written as strings) as (id, bias) pairs."""
    pairs = []
    for key, value in (bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequestError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
        pairs.append((token, value))
    return tuple(pairs)


class CompletionRequest(_SamplingFields):
    # One prompt per request: a string or token ids. A one-element list of either is unwrapped.
    prompt: str | TokenIds | list[str] | list[TokenIds]
    logprobs: StrictInt | None = _documented(minimum=0, maximum=20)
    echo: StrictBool | None = False

    def sampling_params(self) -> SamplingParams:
        return self._params(self.max_tokens, self.logprobs)


class ContentPart(_Request):
    type: str
    text: str | None = None


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: StrictInt | None = _documented(minimum=1)
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = _documented(minimum=0, maximum=20)

    def sampling_params(self) -> SamplingParams:
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        top = self.top_logprobs
        logprobs = (top or 0) if self.logprobs else None
        if top is not None and not self.logprobs:
            # OpenAI insists on logprobs=true here; say so instead of silently dropping it.
            raise InvalidRequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
        return self._params(limit, logprobs)

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]


# -- responses -------------------------------------------------------------------------------


def _now() -> int:
    return int(time.time())


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobInfo(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobInfo] | None = None


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "aserve"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo

"""OpenAI-compatible request models (pydantic) and their mapping to SamplingParams; the response
models are in :mod:`aserve.server.responses`.

Field names follow the OpenAI API so that unmodified clients work. A field a client sends
is either honoured or refused: every OpenAI field aserve does not implement answers 400 naming
it (unless it carries OpenAI's default, which changes nothing), and so does any other unknown
field that is not one of aserve's documented extensions (vLLM's names; :data:`EXTENSIONS`).
Range checks live in :class:`aserve.SamplingParams`, the one place that knows the engine's
limits; the models here only check shapes and types.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from aserve.errors import InvalidRequestError
from aserve.sampling_params import SamplingParams, StructuredOutputs
from aserve.server.tools import ToolUse, tool_use

# Without a max_tokens the OpenAI API generates to the end of the context; a server that
# did that on every bare request would be trivially overloaded, so default to a modest cap.
DEFAULT_MAX_TOKENS = 256

# `StrictInt` keeps JSON floats and strings out of integer fields: OpenAI rejects
# `"max_tokens": "5"` too. `StrictFloat` keeps strings and booleans out of number fields
# (`"temperature": "0.5"`) and accepts ints, as JSON does not tell 1 from 1.0.
TokenIds = list[Annotated[StrictInt, Field(ge=0)]]


def _documented(default: Any = None, **bounds: float) -> Any:
    """A field whose bounds appear in the OpenAPI schema but are enforced by SamplingParams.

    SamplingParams stays the single validator (its messages name the parameter and the
    engine's limits); the schema only tells clients and fuzzers what is accepted.
    """
    return Field(default, json_schema_extra=dict(bounds))


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Strict(_Request):
    """A top-level request body: fields it does not declare are refused, not ignored."""

    # OpenAI's fields that aserve does not implement: accepted only at a value that means
    # "off" (OpenAI's default), refused with 400 naming the field otherwise.
    _unimplemented: ClassVar[dict[str, tuple[Any, ...]]] = {}

    @classmethod
    def parse(cls, body: Any) -> Self:
        """Validate a request body: unknown and unimplemented fields are a 400 naming the field
        (checked before pydantic, whose errors are 422 and would swallow our typed error)."""
        if isinstance(body, dict):
            cls._check_fields(body)
        return cls.model_validate(body)

    @classmethod
    def _check_fields(cls, body: dict[str, Any]) -> None:
        for name, value in body.items():
            if name in cls.model_fields:
                continue
            if name.startswith("guided_"):
                raise InvalidRequestError(
                    f"{name} is vLLM's older spelling; aserve takes structured_outputs "
                    "(json, json_object, regex, choice or grammar) or response_format",
                    param=name,
                )
            allowed = cls._unimplemented.get(name)
            if allowed is not None:
                if not any(value == ok and type(value) is type(ok) for ok in allowed):
                    raise InvalidRequestError(
                        f"{name} is not supported by this server (only {_defaults(allowed)} is accepted); leave it out",
                        param=name,
                    )
                continue
            extensions = sorted(EXTENSIONS & cls.model_fields.keys())
            also = f" and aserve's extensions ({', '.join(extensions)})" if extensions else ""
            raise InvalidRequestError(f"unknown field `{name}`; this endpoint takes OpenAI's fields{also}", param=name)


class StreamOptions(_Request):
    include_usage: StrictBool | None = False
    # Random padding OpenAI may add to each chunk against size side channels; aserve adds
    # none, which changes no content a client reads.
    include_obfuscation: StrictBool | None = None


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


class _SamplingFields(_Strict):
    """Options shared by completions and chat completions."""

    _unimplemented: ClassVar[dict[str, tuple[Any, ...]]] = {
        "service_tier": (None, "auto", "default"),
        "store": (None, False),
        "metadata": (None, {}),
    }

    model: str
    max_tokens: StrictInt | None = _documented(minimum=1)
    n: StrictInt | None = _documented(1, minimum=1, maximum=64)  # OpenAI's n is nullable: null is 1
    stop: str | list[str] | None = None
    seed: StrictInt | None = _documented(minimum=-(2**63), maximum=2**63 - 1)
    temperature: StrictFloat | None = _documented(minimum=0, maximum=2)
    top_p: StrictFloat | None = _documented(exclusiveMinimum=0, maximum=1)
    top_k: StrictInt | None = _documented(minimum=-1)
    min_p: StrictFloat | None = _documented(minimum=0, exclusiveMaximum=1)
    frequency_penalty: StrictFloat | None = _documented(minimum=-2, maximum=2)
    presence_penalty: StrictFloat | None = _documented(minimum=-2, maximum=2)
    repetition_penalty: StrictFloat | None = _documented(exclusiveMinimum=0, maximum=10)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool | None = False
    logit_bias: dict[str, StrictFloat] | None = None  # token id (as a string, as OpenAI sends it) -> bias
    min_tokens: StrictInt | None = _documented(minimum=0)  # vLLM's extension: no stop before this many
    stop_token_ids: TokenIds | None = None  # vLLM's: end on these ids (kept in the output ids)
    include_stop_str_in_output: StrictBool | None = False  # vLLM's: keep the matched stop string
    skip_special_tokens: StrictBool | None = True  # vLLM's: leave special tokens out of the text
    # vLLM's: each choice also carries its token ids (and the prompt's), so a client need not
    # tokenize the text it is sent to count or check tokens.
    return_token_ids: StrictBool | None = False
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None  # vLLM's extension
    # Identify the end user or a cache key; they change nothing in the output, so they are accepted.
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _params(
        self, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None
    ) -> SamplingParams:
        if self.stream_options is not None and not self.stream:
            # OpenAI and vLLM refuse it: its options only shape a stream.
            raise InvalidRequestError("stream_options is only allowed when stream is true", param="stream_options")
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
            n=1 if self.n is None else self.n,
            logit_bias=_token_bias(self.logit_bias),
            min_tokens=self.min_tokens or 0,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            include_stop_str_in_output=bool(self.include_stop_str_in_output),
            skip_special_tokens=self.skip_special_tokens is not False,
            prompt_logprobs=prompt_logprobs,
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


def _defaults(allowed: tuple[Any, ...]) -> str:
    return " or ".join("null" if v is None else json.dumps(v) for v in allowed)


# aserve's documented extensions to OpenAI's request schemas (vLLM's names and meanings).
EXTENSIONS = frozenset(
    {
        "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
        "include_stop_str_in_output", "skip_special_tokens", "structured_outputs", "return_token_ids",
    }
)  # fmt: skip


def _token_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` (keys are token ids written as strings) as (id, bias) pairs."""
    pairs = []
    for key, value in (bias or {}).items():
        if not re.fullmatch(r"-?[0-9]+", key):  # int() would also take " 100 " and "1_00"
            raise InvalidRequestError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
        pairs.append((int(key), value))
    return tuple(pairs)


class CompletionRequest(_SamplingFields):
    # A string, token ids, or a list of either (one choice per prompt, times n).
    prompt: str | TokenIds | list[str] | list[TokenIds]
    # 0 is allowed here (as OpenAI and vLLM allow it): with echo, the answer is the prompt
    # (with its logprobs), finish_reason "length" and no completion token.
    max_tokens: StrictInt | None = _documented(minimum=0)
    logprobs: StrictInt | None = _documented(minimum=0, maximum=20)
    echo: StrictBool | None = False
    best_of: StrictInt | None = None  # only best_of == n (OpenAI's default: 1) is accepted
    suffix: str | None = None  # only null or "" is accepted

    def sampling_params(self) -> SamplingParams:
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidRequestError(
                f"best_of={self.best_of} is not supported (only best_of == n, here {self.n}); leave it out",
                param="best_of",
            )
        if self.suffix:
            raise InvalidRequestError("suffix is not supported; leave it out", param="suffix")
        # echo with logprobs reports the prompt's tokens too (the first has none).
        prompt_logprobs = self.logprobs if self.echo and self.logprobs is not None else None
        return self._params(self.max_tokens, self.logprobs, prompt_logprobs)


class ContentPart(_Request):
    type: str
    text: str | None = None


class ChatMessage(_Request):
    # "developer" is OpenAI's newer name for the system turn; templates know it as "system".
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn's calls (OpenAI's shape)
    tool_call_id: str | None = None  # a tool turn: which call this is the result of


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: StrictInt | None = _documented(minimum=1)
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = _documented(minimum=0, maximum=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None

    _unimplemented: ClassVar[dict[str, tuple[Any, ...]]] = {
        **_SamplingFields._unimplemented,
        "audio": (None,),
        "modalities": (None, ["text"]),
        "prediction": (None,),
        "web_search_options": (None,),
        "functions": (None,),
        "function_call": (None, "none"),
        "reasoning_effort": (None,),
        "verbosity": (None,),
    }

    @classmethod
    def _check_fields(cls, body: dict[str, Any]) -> None:
        if body.get("parallel_tool_calls") is not None and body.get("tools") is None:
            # OpenAI refuses it without tools too; with tools, it belongs to tool calling.
            raise InvalidRequestError("parallel_tool_calls is only allowed with tools", param="parallel_tool_calls")
        super()._check_fields(body)

    def tool_use(self) -> ToolUse | None:
        """The tools a reply may call (checked), or None (no tools, or tool_choice "none")."""
        return tool_use(self.tools, self.tool_choice, self.parallel_tool_calls)

    def sampling_params(self) -> SamplingParams:
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if limit == 0:
            # Only /v1/completions has a use for it (echo); a chat answer of nothing is a mistake.
            name = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
            raise InvalidRequestError(f"{name} must be at least 1 for a chat completion, got 0", param=name)
        top = self.top_logprobs
        logprobs = (top or 0) if self.logprobs else None
        if top is not None and not self.logprobs:
            # OpenAI insists on logprobs=true here; say so instead of silently dropping it.
            raise InvalidRequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
        try:
            params = self._params(limit, logprobs)
        except InvalidRequestError as exc:
            raise self._named(exc) from None
        use = self.tool_use()
        constraint = None if use is None else use.constraint()
        if constraint is not None:
            # "required" or a named function: the grammar engine makes the output a valid call.
            if params.structured_outputs is not None:
                raise InvalidRequestError(
                    "tool_choice required or a named function cannot be combined with response_format "
                    "or structured_outputs", param="tool_choice",
                )  # fmt: skip
            params = params.with_updates(structured_outputs=constraint)
        return params

    @property
    def limit_field(self) -> str:
        """The field that set the output's limit: ``max_completion_tokens`` when given."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def _named(self, exc: InvalidRequestError) -> InvalidRequestError:
        """``exc`` naming the chat field the client sent: SamplingParams checks ``logprobs``
        (chat's ``top_logprobs``) and ``max_tokens`` (or ``max_completion_tokens``)."""
        sent = {"logprobs": "top_logprobs", "max_tokens": self.limit_field}.get(exc.param or "")
        if sent is None or sent == exc.param:
            return exc
        return InvalidRequestError(str(exc).replace(str(exc.param), sent, 1), param=sent)

    def message_dicts(self) -> list[dict[str, Any]]:
        return messages_as_dicts(self.messages)


def messages_as_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as a chat template takes them (a developer turn is a system turn)."""
    out = [m.model_dump(exclude_none=True) for m in messages]
    for m in out:
        if m["role"] == "developer":
            m["role"] = "system"
    return out


class TokenizeCompletionRequest(_Strict):
    """vLLM's ``/tokenize`` of a text."""

    model: str | None = None
    prompt: str
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool | None = False


class TokenizeChatRequest(_Strict):
    """vLLM's ``/tokenize`` of chat messages, laid out as ``/v1/chat/completions`` does."""

    model: str | None = None
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None  # the tools a chat request would offer (vLLM takes them too)
    add_generation_prompt: StrictBool = True
    add_special_tokens: StrictBool = False  # the chat layout already starts with BOS
    return_token_strs: StrictBool | None = False


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: TokenIds

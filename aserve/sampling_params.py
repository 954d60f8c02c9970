"""Per-request generation parameters, validated when a request is admitted."""

from __future__ import annotations

import json as _json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from aserve.errors import InvalidRequestError

# Temperatures below this are greedy (vLLM's cut-off); dividing by them would only overflow.
GREEDY_TEMPERATURE = 1e-5
_MAX_LOGPROBS = 20
# OpenAI's bound. Beyond it the distribution is all but uniform over the vocabulary (text
# no one asked for); a larger value is a client's mistake, so it gets a 400 rather than noise.
MAX_TEMPERATURE = 2.0
_MAX_LOGIT_BIAS = 1024  # entries per request


def penalised(repetition: float, frequency: float, presence: float) -> bool:
    """Whether these penalties make sampling read the tokens generated so far (and the prompt)."""
    return repetition != 1.0 or frequency != 0.0 or presence != 0.0


@dataclass(frozen=True)
class StructuredOutputs:
    """Constrain the output to a language (vLLM's ``structured_outputs``; set exactly one).

    ``json``: a JSON Schema (a dict, or its JSON text); ``json_object``: any JSON object;
    ``regex``: a regular expression the whole output matches; ``choice``: one of these strings;
    ``grammar``: a Lark grammar (llguidance's dialect). The output ends (``finish_reason``
    ``"stop"``) as soon as the language allows no further token; EOS is allowed only where the
    output is complete. Compiled with llguidance (``aserve/sampling/grammar.py``).
    """

    json: str | Mapping[str, Any] | None = None  # stored as canonical JSON text
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        if self.json is not None and not isinstance(self.json, str):
            # Compact text, keys in the order given: llguidance writes an object's properties in
            # the schema's order (as OpenAI does), so a reordered schema is another language.
            try:
                text = _json.dumps(self.json, separators=(",", ":"))
            except (TypeError, ValueError) as exc:
                raise InvalidRequestError(f"json schema is not JSON: {exc}", param="structured_outputs") from exc
            object.__setattr__(self, "json", text)
        if isinstance(self.choice, str):  # one choice, as ``SamplingParams.stop`` takes one string
            object.__setattr__(self, "choice", (self.choice,))
        elif self.choice is not None and not isinstance(self.choice, tuple):
            try:
                object.__setattr__(self, "choice", tuple(self.choice))
            except TypeError as exc:
                raise InvalidRequestError(
                    f"structured_outputs.choice must be a list of strings, got {self.choice!r}",
                    param="structured_outputs",
                ) from exc
        given = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        if self.json_object:
            given.append("json_object")
        if len(given) != 1:
            raise InvalidRequestError(
                f"structured_outputs takes exactly one of json, json_object, regex, choice, grammar; got {given or 'none'}",
                param="structured_outputs",
            )
        for name in ("json", "regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRequestError(
                    f"structured_outputs.{name} must be a non-empty string", param="structured_outputs"
                )
        if self.choice is not None and (not self.choice or any(not isinstance(c, str) or not c for c in self.choice)):
            raise InvalidRequestError("structured_outputs.choice must be non-empty strings", param="structured_outputs")

    @property
    def key(self) -> tuple[str, str]:
        """What the compiled grammar is cached by."""
        if self.json is not None:
            return ("json", str(self.json))
        if self.regex is not None:
            return ("regex", self.regex)
        if self.choice is not None:
            return ("choice", _json.dumps(list(self.choice)))
        if self.grammar is not None:
            return ("grammar", self.grammar)
        return ("json_object", "")


@dataclass(frozen=True)
class SamplingParams:
    """What to generate and when to stop.

    ``temperature == 0`` is greedy. ``top_k`` of 0 or -1 disables top-k. ``seed`` makes
    sampling reproducible whatever else runs in the same batch. ``stop`` strings are
    matched on the text and never appear in (or stream past) the output; ``stop_token_ids``
    end the request on those ids (the id is kept in ``token_ids``, its text is not emitted
    when it is a special token). ``logit_bias`` adds a value in [-100, 100] to the logits of
    the given token ids before sampling (OpenAI's parameter; a dict or (id, bias) pairs).
    Logprobs still describe the model's own distribution. ``min_tokens``: no EOS, stop token
    id or stop string ends the request before this many tokens (vLLM's parameter).
    ``prompt_logprobs``: the logprob of every prompt token after the first, with this many
    alternatives (vLLM's parameter; OpenAI's ``echo`` with ``logprobs``); such a request does
    not read the prefix cache, whose pages come without the logits. ``max_tokens=0``: the
    prompt is only prefilled (its prompt logprobs computed, if asked) and the request ends
    with ``"length"`` and no output token (OpenAI's ``echo`` with ``max_tokens`` 0).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None
    n: int = 1
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    min_tokens: int = 0
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputs | None = None

    def __post_init__(self) -> None:
        # Accept lists/str for convenience; store tuples so the object stays hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", _as_tuple(self.stop, "stop", "a string or a list of strings"))
        if not isinstance(self.stop_token_ids, tuple):
            ids = _as_tuple(self.stop_token_ids, "stop_token_ids", "a list of token ids")
            object.__setattr__(self, "stop_token_ids", ids)
        bias = self.logit_bias
        try:
            if isinstance(bias, Mapping):
                bias = tuple(bias.items())
            elif not isinstance(bias, tuple):
                bias = tuple(bias)
            pairs = tuple(sorted((tok, val) for tok, val in bias))
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(
                "logit_bias must map token ids to numbers, as a dict or (id, bias) pairs", param="logit_bias"
            ) from exc
        object.__setattr__(self, "logit_bias", pairs)
        if isinstance(self.structured_outputs, Mapping):
            try:
                so = StructuredOutputs(**self.structured_outputs)
            except TypeError as exc:
                raise InvalidRequestError(f"structured_outputs: {exc}", param="structured_outputs") from exc
            object.__setattr__(self, "structured_outputs", so)
        elif self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputs):
            raise InvalidRequestError(
                f"structured_outputs must be a StructuredOutputs or a dict, got {self.structured_outputs!r}",
                param="structured_outputs",
            )
        self.validate()

    # Cached (the instance is frozen): the planner and the launch path ask per request per step.
    @cached_property
    def has_penalty(self) -> bool:
        """Whether sampling reads the tokens generated so far (and the prompt): such a request's
        next step needs its last token committed (a look-ahead of one)."""
        return penalised(self.repetition_penalty, self.frequency_penalty, self.presence_penalty)

    @cached_property
    def is_plain_greedy(self) -> bool:
        """Whether the token is the plain argmax: greedy, no penalty, no bias, no logprobs."""
        return self.is_greedy_argmax and self.structured_outputs is None

    @cached_property
    def is_greedy_argmax(self) -> bool:
        """Whether the token is the argmax of the logits after a grammar's mask (if any):
        plain greedy, or greedy with structured outputs and nothing else."""
        return (
            self.temperature < GREEDY_TEMPERATURE
            and self.logprobs is None
            and not self.has_penalty
            and not self.logit_bias
        )

    def validate(self) -> None:
        def bad(param: str, msg: str) -> InvalidRequestError:
            return InvalidRequestError(f"{param} {msg}", param=param)

        if not _is_int(self.max_tokens) or self.max_tokens < 0:
            raise bad("max_tokens", f"must be an integer >= 0, got {self.max_tokens!r}")
        if not _is_real(self.temperature) or not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise bad("temperature", f"must be in [0, {MAX_TEMPERATURE:g}] (0 means greedy), got {self.temperature!r}")
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise bad("top_k", f"must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if not _is_real(self.min_p) or not 0.0 <= self.min_p < 1.0:
            raise bad("min_p", f"must be in [0, 1), got {self.min_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not -(2**63) <= self.seed < 2**63):
            raise bad("seed", f"must be a 64-bit integer, got {self.seed!r}")
        if not _is_real(self.repetition_penalty) or not 0.0 < self.repetition_penalty <= 10.0:
            raise bad("repetition_penalty", f"must be in (0, 10], got {self.repetition_penalty!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2.0 <= value <= 2.0:
                raise bad(name, f"must be in [-2, 2], got {value!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "must be non-empty strings")
        if len(self.stop) > 16:
            raise bad("stop", f"allows at most 16 strings, got {len(self.stop)}")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be non-negative integers")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= _MAX_LOGPROBS):
            raise bad("logprobs", f"must be an integer in [0, {_MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.prompt_logprobs is not None and (
            not _is_int(self.prompt_logprobs) or not 0 <= self.prompt_logprobs <= _MAX_LOGPROBS
        ):
            raise bad("prompt_logprobs", f"must be an integer in [0, {_MAX_LOGPROBS}], got {self.prompt_logprobs!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise bad("min_tokens", f"must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        if len(self.logit_bias) > _MAX_LOGIT_BIAS:
            raise bad("logit_bias", f"allows at most {_MAX_LOGIT_BIAS} entries, got {len(self.logit_bias)}")
        for tok, val in self.logit_bias:
            if not _is_int(tok) or tok < 0:
                raise bad("logit_bias", f"keys must be non-negative token ids, got {tok!r}")
            if not _is_real(val) or not -100.0 <= val <= 100.0:
                raise bad("logit_bias", f"values must be in [-100, 100], got {val!r} for token {tok}")
        if len({tok for tok, _ in self.logit_bias}) != len(self.logit_bias):
            raise bad("logit_bias", "has a token id more than once")
        if not _is_int(self.n) or not 1 <= self.n <= 64:
            raise bad("n", f"must be an integer in [1, 64], got {self.n!r}")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, f"must be true or false, got {getattr(self, name)!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def with_updates(self, **changes: object) -> SamplingParams:
        return replace(self, **changes)  # type: ignore[arg-type]


def _as_tuple(value: Any, param: str, what: str) -> tuple[Any, ...]:
    """``tuple(value)``, or the typed error for a value that is not a collection."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise InvalidRequestError(f"{param} must be {what}, got {value!r}", param=param)
    return tuple(value)


def choice_seed(seed: int, index: int) -> int:
    """Choice ``index``'s seed of a request seeded ``seed``: ``seed + index``, wrapped into the
    signed 64-bit range the sampler's generators take (so a seed near 2**63 with ``n > 1``
    stays valid rather than overflowing at launch)."""
    return (seed + index + 2**63) % 2**64 - 2**63


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))

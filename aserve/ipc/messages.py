"""What the core and the front ends say to each other: msgspec structs, encoded as msgpack.

msgspec decodes into declared types only (no pickle, no arbitrary objects), and it checks
what it decodes: ``SamplingParams`` is rebuilt through its own validation.
"""

from __future__ import annotations

from typing import Any

import msgspec

from aserve.sampling_params import SamplingParams


class Add(msgspec.Struct, tag=True, array_like=True):
    """A front end submits a request (its ``n`` choices share the prompt; one seed each)."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    seeds: list[int]


class Abort(msgspec.Struct, tag=True, array_like=True):
    rids: list[str]


class Query(msgspec.Struct, tag=True, array_like=True):
    """An RPC: ``what`` is ``"flush_cache"``; answered by a ``Reply`` with the same ``qid``."""

    qid: int
    what: str


class Bye(msgspec.Struct, tag=True, array_like=True):
    """A front end leaves: the core aborts whatever it still has running."""


class Hello(msgspec.Struct, tag=True, array_like=True):
    """A front end says it is there (and again every heartbeat interval), and whether it is
    ready to serve (its tokenizer loaded)."""

    ready: bool = False


class Accepted(msgspec.Struct, tag=True, array_like=True):
    """The core admitted an ``Add`` (its outputs follow in ``Outputs`` messages)."""

    rid: str


class Rejected(msgspec.Struct, tag=True, array_like=True):
    """The core refused an ``Add`` (queue full, engine closed): the error to raise."""

    rid: str
    error: str  # the aserve.errors class name
    message: str
    param: str | None = None


class Output(msgspec.Struct, array_like=True):
    """New committed output of one choice since the last message."""

    rid: str  # the request id the front end sent
    index: int
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    text_limit: int | None = None  # where the final text ends (a stop string was found)
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None = None
    cached_tokens: int = 0
    # On a choice's first tokens, with SamplingParams.prompt_logprobs: None for the first prompt token.
    prompt_logprobs: list[tuple[int, float, list[tuple[int, float]]] | None] | None = None
    error: str | None = None  # the request failed: an aserve.errors class name ...
    error_message: str | None = None  # ... and its message


class Outputs(msgspec.Struct, tag=True, array_like=True):
    """One message per front end per step: every choice of it with something new.

    Most choices on most steps only have new tokens: those come in columns, choice ``k`` being
    ``(rids[k], indexes[k])`` with the next ``counts[k]`` of ``token_ids`` and its cached
    prompt tokens. A choice's first tokens, its end, and anything with logprobs come as
    ``items``. A choice is in one or the other within a message; the front end applies the
    columns first. (Columns halve the core's cost a choice: 37 against 19 us a step for 64
    choices on this project's VM, and the front end decodes them in 4 us instead of 11.)"""

    items: list[Output]
    rids: list[str] = msgspec.field(default_factory=list)
    indexes: list[int] = msgspec.field(default_factory=list)
    counts: list[int] = msgspec.field(default_factory=list)
    token_ids: list[int] = msgspec.field(default_factory=list)
    cached: list[int] = msgspec.field(default_factory=list)


class Status(msgspec.Struct, tag=True, array_like=True):
    """The core's heartbeat and its stats for /metrics. ``ready``: the service is up, i.e. every
    front end started with it has been ready (so no /health says 200 while a sibling would
    still answer 503); it stays true while a replacement front end starts. ``failure``: the
    engine stopped after a fault (``EngineFailedError``'s message); sent at once when it
    happens and in every heartbeat after, so each front end answers 503 ``engine_failed``."""

    ready: bool
    stats: dict[str, Any]
    failure: str | None = None


class Welcome(msgspec.Struct, tag=True, array_like=True):
    """The core's answer to a front end's first ``Hello``: what admission needs to know."""

    model: str
    model_path: str
    vocab_size: int
    max_context: int
    kv_tokens: int
    eos_token_ids: list[int]
    max_waiting_requests: int
    info: dict[str, Any]


class Reply(msgspec.Struct, tag=True, array_like=True):
    qid: int
    value: Any


ToCore = Add | Abort | Query | Hello | Bye
ToFrontEnd = Outputs | Accepted | Rejected | Status | Welcome | Reply

_enc = msgspec.msgpack.Encoder()
_to_core = msgspec.msgpack.Decoder(ToCore)
_to_front_end = msgspec.msgpack.Decoder(ToFrontEnd)


def encode(msg: msgspec.Struct) -> bytes:
    return _enc.encode(msg)


def decode_to_core(data: bytes) -> ToCore:
    return _to_core.decode(data)


def decode_to_front_end(data: bytes) -> ToFrontEnd:
    return _to_front_end.decode(data)

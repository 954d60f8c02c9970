"""A front end's half of a request's outputs: the core's ``Outputs`` messages pushed into the
output cells its requests' streams read (the cells a local engine fills, so streaming,
detokenization and ``complete`` are the engine's own code), and an error named on the wire
rebuilt as its type. :class:`~aserve.ipc.client.EngineClient`'s receive loop calls these
with its live requests (request id -> its choices, by index).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from aserve import errors
from aserve.errors import AserveError, EngineFailedError
from aserve.ipc import messages as m
from aserve.outputs import TokenLogprob
from aserve.scheduler.req import Req


def error_from(name: str, message: str, param: str | None = None) -> AserveError:
    """The error the core named (its class name in :mod:`aserve.errors`); an unknown name
    is a :class:`~aserve.errors.RequestAbortedError`."""
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, AserveError)):
        cls = errors.RequestAbortedError
    if issubclass(cls, errors.InvalidRequestError):
        return cls(message, param=param)
    return cls(message)


def finish(req: Req, reason: str, stop_reason: str | int | None = None) -> None:
    """End ``req`` here with ``reason``; its cell tells its stream."""
    req.finish_reason = reason  # type: ignore[assignment]
    req.stop_reason = stop_reason
    req.finish_time = time.perf_counter()
    if req.cell is not None:
        req.cell.finish(req.finish_reason, stop_reason)  # type: ignore[arg-type]


def deliver_columns(live: dict[str, list[Req]], msg: m.Outputs) -> None:
    """A step's next tokens of choices past their first (``Outputs``' columns)."""
    tokens, at = msg.token_ids, 0
    for rid, index, count, cached in zip(msg.rids, msg.indexes, msg.counts, msg.cached, strict=True):
        ids = tokens[at : at + count]
        at += count
        reqs = live.get(rid)
        if reqs is None:
            continue  # aborted here meanwhile
        req = reqs[index]
        cell = req.cell
        if cell is None or req.finished:
            continue
        req.cached_prompt_tokens = cached
        req.output_ids += ids
        for token in ids:
            cell.push(token, None)


def deliver(live: dict[str, list[Req]], items: Sequence[m.Output], engine_failed: Callable[[str], None]) -> None:
    """The core's per-choice outputs into the requests' cells; a request whose choices have
    all finished leaves ``live``. ``engine_failed`` hears of an :class:`EngineFailedError`
    as soon as a request brings one."""
    now = time.perf_counter()
    for item in items:
        reqs = live.get(item.rid)
        if reqs is None:
            continue  # aborted here meanwhile
        req = reqs[item.index]
        cell = req.cell
        if cell is None or req.finished:
            continue
        req.cached_prompt_tokens = item.cached_tokens
        if item.prompt_logprobs is not None:
            cell.prompt_logprobs = [
                None if p is None else TokenLogprob(p[0], p[1], tuple((t, v) for t, v in p[2]))
                for p in item.prompt_logprobs
            ]
        if item.token_ids and req.first_token_time is None:
            req.first_token_time = now
        lps = item.logprobs
        for k, token in enumerate(item.token_ids):
            lp = None
            if lps is not None:
                tid, logprob, top = lps[k]
                lp = TokenLogprob(tid, logprob, tuple((t, v) for t, v in top))
            req.output_ids.append(token)
            cell.push(token, lp)
        if item.error is not None:
            req.finish_reason = "abort"
            cell.fail(error_from(item.error, item.error_message or item.error))
            if item.error == EngineFailedError.__name__:
                # The engine's fault reaches this front end with its requests' errors, maybe
                # before the core's Status says so: /health must not lag the 503 sent.
                engine_failed(item.error_message or item.error)
        elif item.finish_reason is not None:
            cell.text_limit = item.text_limit
            finish(req, item.finish_reason, item.stop_reason)
        if all(r.finished for r in reqs):
            live.pop(item.rid, None)

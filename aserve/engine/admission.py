"""Admission: a caller's prompt and parameters become validated requests, or a typed error.

Everything a request is checked against is checked here, once, before anything runs: the
prompt (text or token ids in the vocabulary), the logit bias ids, the context and the KV pool,
the waiting queue. The length limit is settled here too: ``max_tokens`` clipped to the context
and to the pool becomes ``Req.max_new_tokens``, which only ``Req.length_reached`` reads.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from aserve.config import EngineConfig
from aserve.engine.cell import OutputCell
from aserve.engine.setup import LoadedEngine
from aserve.errors import ContextLengthError, EngineOverloadedError, InvalidRequestError
from aserve.sampling_params import SamplingParams
from aserve.scheduler.req import Req
from aserve.sync import Signal

Prompt = str | Sequence[int]


class Admission:
    def __init__(self, parts: LoadedEngine, config: EngineConfig) -> None:
        self.parts = parts
        self.config = config
        self._ids = itertools.count()
        self._rng = random.Random(config.seed)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        parts = self.parts
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt is empty; give at least one character or token", param="prompt")
            return parts.tokenizer.encode(prompt, add_special_tokens=True)
        ids = list(prompt)
        if not ids:
            raise InvalidRequestError("prompt is empty; give at least one token id", param="prompt")
        vocab = parts.model_config.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}", param="prompt"
            )
        return ids

    def make_requests(
        self, prompt: Prompt, params: SamplingParams, request_id: str | None, *, waiting: int, whole: bool
    ) -> list[Req]:
        """The ``params.n`` requests of one call. ``waiting``: requests submitted and not yet
        admitted (for the queue limit). ``whole=True`` (``complete``): the consumer is woken only
        when a choice finishes; otherwise every ``stream_interval`` tokens."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be an aserve.SamplingParams", param="params")
        parts, pool = self.parts, self.parts.pool
        ids = self.prompt_ids(prompt)
        if params.logit_bias:
            vocab = parts.model_config.vocab_size
            outside = [t for t, _ in params.logit_bias if t >= vocab]
            if outside:
                raise InvalidRequestError(
                    f"logit_bias token ids must be in [0, {vocab}); got {outside[:5]}", param="logit_bias"
                )
        ctx = pool.max_context
        if len(ids) >= ctx:
            raise ContextLengthError(
                f"prompt has {len(ids)} tokens but the context holds {ctx} "
                f"(prompt + at least 1 output token); shorten the prompt",
                param="prompt",
            )
        if len(ids) + 1 > pool.total_tokens:
            raise ContextLengthError(
                f"prompt has {len(ids)} tokens but the KV pool holds only {pool.total_tokens}; "
                "shorten the prompt or give the engine more KV memory",
                param="prompt",
            )
        if waiting + params.n > self.config.max_waiting_requests:
            raise EngineOverloadedError(
                f"{waiting} requests are waiting (limit {self.config.max_waiting_requests}); retry later"
            )
        rid = request_id or f"req-{next(self._ids)}"
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(parts.eos_token_ids)
        # One request never needs more KV than the context or the whole pool holds.
        max_new_tokens = min(params.max_tokens, ctx - len(ids), pool.total_tokens - len(ids))
        signal = Signal()  # one consumer waits for any of the n choices
        wake_every = 0 if whole else self.config.stream_interval
        return [
            Req(
                rid=rid if params.n == 1 else f"{rid}.{i}",
                index=i,
                prompt_ids=ids,
                params=params,
                max_new_tokens=max_new_tokens,
                group_id=rid,
                seed=params.seed + i if params.seed is not None else self._rng.getrandbits(63),
                stop_ids=frozenset(stop_ids),
                cell=OutputCell(signal, wake_every=wake_every),
            )
            for i in range(params.n)
        ]

"""Admission: a caller's prompt and parameters become validated requests, or a typed error.

Everything a request is checked against is checked here, once, before anything runs: the
prompt (text or token ids in the vocabulary), the logit bias ids, the context and the KV pool,
the waiting queue. The length limit is settled here too: ``max_tokens`` clipped to the context
and to the pool becomes ``Req.max_new_tokens``, which only ``Req.length_reached`` reads.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from aserve.engine.cell import OutputCell
from aserve.errors import ContextLengthError, EngineOverloadedError, InvalidRequestError
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import GrammarState
from aserve.sampling_params import SamplingParams, choice_seed
from aserve.scheduler.req import Req
from aserve.sync import Signal
from aserve.tokenizer.tokenizer import Tokenizer

Prompt = str | Sequence[int]


def check_prompt_list(prompts: object) -> None:
    """``complete_many`` / ``open_streams`` take a list of prompts: a bare string (which
    would be taken as one prompt per character) is refused."""
    if isinstance(prompts, str):
        raise InvalidRequestError(
            "prompts must be a list of prompts; for one prompt string call complete() or open_stream()",
            param="prompt",
        )


@dataclass(frozen=True)
class AdmissionLimits:
    """What a request is checked against: the engine's (and, over IPC, the core's) limits."""

    vocab_size: int
    max_context: int
    kv_tokens: int
    eos_token_ids: tuple[int, ...]
    max_waiting_requests: int
    stream_interval: int


class Admission:
    def __init__(
        self, limits: AdmissionLimits, tokenizer: Tokenizer, seed: int | None = None, grammars: Grammars | None = None
    ) -> None:
        self.limits = limits
        self.tokenizer = tokenizer
        self.grammars = grammars  # structured outputs; None in a front end (the core compiles)
        self._ids = itertools.count()
        self._rng = random.Random(seed)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt is empty; give at least one character or token", param="prompt")
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, (bytes, Mapping)) or not isinstance(prompt, Iterable):
            raise InvalidRequestError(
                f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", param="prompt"
            )
        ids = list(prompt)
        if not ids:
            raise InvalidRequestError("prompt is empty; give at least one token id", param="prompt")
        vocab = self.limits.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}", param="prompt"
            )
        return ids

    def make_requests(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None,
        *,
        waiting: int,
        whole: bool,
        seeds: Sequence[int] | None = None,
        signal: Signal | None = None,
        wake_every: int | None = None,
    ) -> list[Req]:
        """The ``params.n`` requests of one call. ``waiting``: requests submitted and not yet
        admitted (for the queue limit). ``whole=True`` (``complete``): the consumer is woken only
        when a choice finishes; otherwise every ``stream_interval`` tokens. ``seeds`` (one per
        choice) and ``signal`` (a wake-up shared with other requests, woken at every token) are
        for the engine core serving a front end, which chose the seeds and reads per step.
        ``wake_every`` overrides when a token wakes the consumer (a list prompt's requests
        share one ``signal`` and one consumer, which keeps the stream's interval)."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be an aserve.SamplingParams", param="params")
        lim = self.limits
        ids = self.prompt_ids(prompt)
        if params.logit_bias:
            vocab = lim.vocab_size
            outside = [t for t, _ in params.logit_bias if t >= vocab]
            if outside:
                raise InvalidRequestError(
                    f"logit_bias token ids must be in [0, {vocab}); got {outside[:5]}", param="logit_bias"
                )
        outside = [t for t in params.stop_token_ids if t >= lim.vocab_size]
        if outside:
            raise InvalidRequestError(
                f"stop_token_ids must be in [0, {lim.vocab_size}); got {outside[:5]}", param="stop_token_ids"
            )
        ctx = lim.max_context
        if len(ids) >= ctx:
            raise ContextLengthError(
                f"prompt has {len(ids)} tokens but the context holds {ctx} "
                f"(prompt + at least 1 output token); shorten the prompt",
                param="prompt",
            )
        if len(ids) + 1 > lim.kv_tokens:
            raise ContextLengthError(
                f"prompt has {len(ids)} tokens but the KV pool holds only {lim.kv_tokens}; "
                "shorten the prompt or give the engine more KV memory",
                param="prompt",
            )
        if waiting + params.n > lim.max_waiting_requests:
            raise EngineOverloadedError(
                f"{waiting} requests are waiting (limit {lim.max_waiting_requests}); retry later"
            )
        if seeds is not None and len(seeds) != params.n:
            raise InvalidRequestError(f"{len(seeds)} seeds for n={params.n} choices", param="seed")
        grammars: list[GrammarState | None] = [None] * params.n
        if params.structured_outputs is not None and self.grammars is not None:
            # Compiled here (cached by schema), so a bad grammar is a 400 before anything runs.
            # A front end (no grammars of its own) leaves it to the core's admission.
            grammars = [self.grammars.state(params.structured_outputs) for _ in range(params.n)]
        rid = request_id or f"req-{next(self._ids)}"
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(lim.eos_token_ids)
        # One request never needs more KV than the context or the whole pool holds.
        max_new_tokens = min(params.max_tokens, ctx - len(ids), lim.kv_tokens - len(ids))
        if wake_every is None:
            wake_every = 1 if signal is not None else 0 if whole else lim.stream_interval
        if signal is None:
            signal = Signal()  # one consumer waits for any of the n choices
        return [
            Req(
                rid=rid if params.n == 1 else f"{rid}.{i}",
                index=i,
                prompt_ids=ids,
                params=params,
                max_new_tokens=max_new_tokens,
                group_id=rid,
                seed=seeds[i]
                if seeds is not None
                else choice_seed(params.seed, i)
                if params.seed is not None
                else self._rng.getrandbits(63),
                stop_ids=frozenset(stop_ids),
                cell=OutputCell(signal, wake_every=wake_every),
                grammar=grammars[i],
            )
            for i in range(params.n)
        ]

"""Host-side sampling inputs: the per-request knobs the sampler reads and the per-step batch.

:func:`~aserve.sampling.sampler.sample` runs without host-device synchronisation, so every
decision that changes *which* ops it runs (is anything greedy, is top-p used, how wide a
``topk`` must be, ...) is made here on the host, from plain Python values, and handed in as
host flags on :class:`SamplingBatch` next to its tensors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from aserve.sampling_params import GREEDY_TEMPERATURE, penalised

__all__ = ["SamplingBatch", "SamplingParamsLike", "make_sampling_batch"]

_GREEDY_EPS = GREEDY_TEMPERATURE


class SamplingParamsLike(Protocol):
    """The per-request knobs the sampler reads (any object with these attributes).

    Read-only properties so frozen dataclasses (e.g. ``aserve.sampling_params``) match."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...
    @property
    def min_p(self) -> float: ...
    @property
    def repetition_penalty(self) -> float: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def presence_penalty(self) -> float: ...
    @property
    def logprobs(self) -> int | None: ...
    @property
    def logit_bias(self) -> tuple[tuple[int, float], ...]: ...  # (token id, bias), sorted


@dataclass
class SamplingBatch:
    """Per-step sampling inputs; tensors already live on the logits' device."""

    temperature: Tensor  # [B] float32; 0 means greedy for that row
    top_k: Tensor  # [B] int64; 0 or -1 means off (full vocab)
    top_p: Tensor  # [B] float32 in (0, 1]; 1 means off
    min_p: Tensor  # [B] float32 in [0, 1); 0 means off
    seeds: Tensor  # [B] int64 per-request seed
    steps: Tensor  # [B] int64 index of the output token being sampled (0 for the first)
    repetition_penalty: Tensor  # [B] float32, 1 = off (prompt + output tokens)
    frequency_penalty: Tensor  # [B] float32, 0 = off (output tokens only)
    presence_penalty: Tensor  # [B] float32, 0 = off (output tokens only)
    prompt_tokens: Tensor | None  # [B, Lp] int64 padded with -1; None if no repetition penalty
    output_tokens: Tensor | None  # [B, Lo] int64 padded with -1; None if no penalty at all
    # Sparse logit biases: [2, N] int64 (row, token id) and [N] float32; None if no row has any.
    bias_index: Tensor | None
    bias_values: Tensor | None
    # Structured outputs: the rows with a grammar [R] int64 and their allowed-token bitmasks
    # [R, ceil(V / 32)] int32 (aserve.sampling.masks); None if no row has a grammar.
    mask_rows: Tensor | None
    mask_bits: Tensor | None
    # Host-side flags: they pick which ops run, so cheap batches skip work.
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool
    any_min_p: bool
    any_penalty: bool
    num_logprobs: int  # max top-logprobs requested in the batch; -1 = no row wants logprobs
    # Largest top-k of any row (host value): lets a top-k-only batch use ``torch.topk``
    # instead of a full-vocab sort. 0 = unknown, which falls back to the sorting path.
    max_top_k: int = 0
    # Every sampled row has a top-k (the head may then hand over its top candidates only).
    all_top_k: bool = False

    def tensors(self) -> dict[str, Tensor]:
        """The tensor fields by name (what an upload to the device moves)."""
        return {f.name: v for f in dataclasses.fields(self) if isinstance(v := getattr(self, f.name), Tensor)}

    def replace_tensors(self, tensors: dict[str, Tensor]) -> SamplingBatch:
        """The same batch with these tensor fields swapped (their device copies)."""
        return dataclasses.replace(self, **tensors)  # type: ignore[arg-type]


def _pad(rows: Sequence[Sequence[int]], device: torch.device | str) -> Tensor:
    """Rows of token ids -> [B, max(1, longest)] int64 padded with -1."""
    width = max([1, *(len(r) for r in rows)])
    padded = [list(r) + [-1] * (width - len(r)) for r in rows]
    return torch.tensor(padded, dtype=torch.int64, device=device)


def make_sampling_batch(
    params_list: Sequence[SamplingParamsLike],
    seeds: Sequence[int],
    steps: Sequence[int],
    prompt_ids_list: Sequence[Sequence[int]],
    output_ids_list: Sequence[Sequence[int]],
    device: torch.device | str,
    banned_list: Sequence[Collection[int]] | None = None,
    masks: tuple[list[int], Tensor | None] | None = None,
) -> SamplingBatch:
    """Build a :class:`SamplingBatch` from plain Python values (host work, one upload per
    tensor). Host flags only count non-greedy rows for top-k/top-p/min-p, since greedy rows
    ignore those knobs. ``banned_list``: per row, token ids that must not be sampled this
    step (a request under its ``min_tokens`` bans its stop ids); they override its bias.
    ``masks``: (rows, [R, words] int32 bitmasks) of the rows a grammar constrains; the bitmasks
    may be None, to be set later (``mask_bits``: a split launch)."""
    n = len(params_list)
    if not (len(seeds) == len(steps) == len(prompt_ids_list) == len(output_ids_list) == n):
        raise ValueError("make_sampling_batch: all per-row lists must have the same length")

    temps = [float(p.temperature) for p in params_list]
    greedy = [t < _GREEDY_EPS for t in temps]
    top_ks = [int(p.top_k) if p.top_k > 0 else 0 for p in params_list]
    top_ps = [float(p.top_p) for p in params_list]
    min_ps = [float(p.min_p) for p in params_list]
    reps = [float(p.repetition_penalty) for p in params_list]
    freqs = [float(p.frequency_penalty) for p in params_list]
    press = [float(p.presence_penalty) for p in params_list]
    sampled_rows = [i for i in range(n) if not greedy[i]]

    any_rep = any(r != 1.0 for r in reps)
    any_penalty = any(map(penalised, reps, freqs, press))
    requested = [p.logprobs for p in params_list if p.logprobs is not None]
    bias_rows: list[int] = []
    bias_ids: list[int] = []
    bias_vals: list[float] = []
    for i, p in enumerate(params_list):
        banned = banned_list[i] if banned_list is not None else ()
        for tok, val in p.logit_bias:
            if tok not in banned:  # (row, id) pairs stay unique: the scatter does not accumulate
                bias_rows.append(i)
                bias_ids.append(tok)
                bias_vals.append(float(val))
        for tok in banned:
            bias_rows.append(i)
            bias_ids.append(tok)
            bias_vals.append(-math.inf)

    def f32(values: list[float]) -> Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device)

    def i64(values: Sequence[int]) -> Tensor:
        return torch.tensor(list(values), dtype=torch.int64, device=device)

    return SamplingBatch(
        temperature=f32([0.0 if g else t for g, t in zip(greedy, temps, strict=True)]),
        top_k=i64(top_ks),
        top_p=f32(top_ps),
        min_p=f32(min_ps),
        seeds=i64(seeds),
        steps=i64(steps),
        repetition_penalty=f32(reps),
        frequency_penalty=f32(freqs),
        presence_penalty=f32(press),
        prompt_tokens=_pad(prompt_ids_list, device) if any_rep else None,
        output_tokens=_pad(output_ids_list, device) if any_penalty else None,
        bias_index=i64(bias_rows + bias_ids).view(2, -1) if bias_rows else None,
        bias_values=f32(bias_vals) if bias_rows else None,
        mask_rows=None if masks is None else i64(masks[0]),
        mask_bits=None if masks is None or masks[1] is None else masks[1].to(device),
        all_greedy=not sampled_rows,
        any_top_k=any(top_ks[i] > 0 for i in sampled_rows),
        any_top_p=any(top_ps[i] < 1.0 for i in sampled_rows),
        any_min_p=any(min_ps[i] > 0.0 for i in sampled_rows),
        any_penalty=any_penalty,
        num_logprobs=max(requested) if requested else -1,
        max_top_k=max([0, *(top_ks[i] for i in sampled_rows)]),
        all_top_k=all(top_ks[i] > 0 for i in sampled_rows),
    )

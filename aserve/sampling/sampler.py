"""Batched, device-resident token sampling with seeded, batch-independent randomness.

Everything in :func:`sample` runs as tensor ops on the logits' device with no host-device
synchronisation: no ``.item()``/``.tolist()``/``.cpu()``, no boolean-mask indexing (whose
output shape depends on data), and no Python branching on tensor values. Every decision that
changes *which* ops run (is anything greedy, is top-p used, how wide a ``topk`` must be, ...)
is made on the host by the engine and handed in as plain Python values on
:class:`SamplingBatch`.

Processing order (vLLM/OpenAI semantics where the two agree):

1. penalties: repetition (prompt + output tokens), frequency and presence (output only);
2. temperature (rows with temperature 0 are greedy: argmax of the penalised logits);
3. top-k, 4. top-p (smallest most-likely set with cumulative probability >= top_p, always
   keeping the top token), 5. min-p (drop tokens with prob < min_p * max_prob);
6. draw with the exponential race: ``argmax_i p_i / E_i`` with ``E_i ~ Exp(1)`` i.i.d. picks
   token ``i`` with probability exactly ``p_i`` (the first arrival of independent Poisson
   clocks with rates ``p_i``). Unnormalised ``p`` is fine because argmax ignores scaling.

The draw's uniforms come from :mod:`aserve.sampling.noise` (a counter-based hash of seed,
step and token index); the host builds the batch in :mod:`aserve.sampling.batch`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from aserve.sampling.batch import SamplingBatch, SamplingParamsLike, make_sampling_batch
from aserve.sampling.masks import allowed_tokens
from aserve.sampling.noise import _cpu_kernel, _exp_noise, _ids_hash, _row_keys, _token_hash, uniform_noise
from aserve.sampling_params import GREEDY_TEMPERATURE

# SamplingBatch, SamplingParamsLike, make_sampling_batch (batch.py) and uniform_noise (noise.py)
# are re-exported: importers name them from here.
__all__ = [
    "SampleOutput",
    "SamplingBatch",
    "SamplingParamsLike",
    "apply_penalties",
    "make_sampling_batch",
    "sample",
    "uniform_noise",
]

_GREEDY_EPS = GREEDY_TEMPERATURE


@dataclass
class SampleOutput:
    token_ids: Tensor  # [B] int64
    logprobs: Tensor | None  # [B] float32, chosen token's logprob under the raw distribution
    top_ids: Tensor | None  # [B, K] int64, K = num_logprobs (may be 0), descending
    top_logprobs: Tensor | None  # [B, K] float32
    # Prompt logprobs of the step's prefill positions that asked for them (E rows in all).
    prompt_logprobs: Tensor | None = None  # [E] float32, the next prompt token's logprob
    prompt_top_ids: Tensor | None = None  # [E, K] int64
    prompt_top_logprobs: Tensor | None = None  # [E, K] float32


def prompt_logprobs(logits: Tensor, targets: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """logits: [E, V] float32 at prompt positions; targets: [E] the prompt token that follows
    each. Returns the targets' logprobs [E] and the top ``k`` (ids [E, k], logprobs [E, k])
    under the raw distribution."""
    lsm = torch.log_softmax(logits, dim=-1)
    chosen = lsm.gather(1, targets[:, None])[:, 0]
    top = lsm.topk(k, dim=-1)
    return chosen, top.indices, top.values


def apply_penalties(
    logits: Tensor,
    prompt_tokens: Tensor | None,
    output_tokens: Tensor | None,
    repetition_penalty: Tensor,
    frequency_penalty: Tensor,
    presence_penalty: Tensor,
) -> Tensor:
    """Return penalised logits (a new tensor; the input is not modified).

    logits: [B, V] float32; prompt_tokens: [B, Lp] / output_tokens: [B, Lo] int64 padded
    with -1 (either may be None); penalties: [B] float32.
    """
    batch, vocab = logits.shape
    device = logits.device
    # Padding (-1) is routed to an extra dummy column V that is dropped afterwards, so the
    # scatter needs no data-dependent filtering.
    seen = torch.zeros(batch, vocab + 1, dtype=torch.bool, device=device)  # [B, V+1]
    counts: Tensor | None = None
    if output_tokens is not None:
        out_idx = torch.where(output_tokens < 0, vocab, output_tokens)  # [B, Lo]
        counts_full = torch.zeros(batch, vocab + 1, dtype=torch.float32, device=device)
        counts_full.scatter_add_(1, out_idx, torch.ones_like(out_idx, dtype=torch.float32))
        counts = counts_full[:, :vocab]  # [B, V] occurrences in the output
        seen.scatter_(1, out_idx, True)
    if prompt_tokens is not None:
        prompt_idx = torch.where(prompt_tokens < 0, vocab, prompt_tokens)  # [B, Lp]
        seen.scatter_(1, prompt_idx, True)
    seen_v = seen[:, :vocab]  # [B, V]

    rep = repetition_penalty[:, None]  # [B, 1]
    # vLLM semantics: shrink seen tokens' logits towards 0 (divide positives, multiply
    # negatives), so the penalty always makes a seen token less likely.
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    out = torch.where(seen_v, penalised, logits)
    if counts is not None:
        out = out - frequency_penalty[:, None] * counts
        out = out - presence_penalty[:, None] * (counts > 0).to(torch.float32)
    return out


def _race(scaled: Tensor, keep: Tensor | None, noise_hash: Tensor, keys: Tensor) -> Tensor:
    """Exponential race over the last dim. scaled: [B, N] temperature-scaled logits;
    keep: [B, N] bool or None; noise_hash: [V] or [B, N] token hashes aligned with
    ``scaled``. Returns [B] int64 column indices of the winners."""
    row_max = scaled.max(dim=-1, keepdim=True).values  # [B, 1], always a kept token
    if scaled.device.type == "cpu" and scaled.shape[1] > _CPU_RACE_CHUNK:
        return _race_chunked(scaled, keep, noise_hash, keys, row_max)
    weights = torch.exp(scaled - row_max)  # [B, N] unnormalised probs in [0, 1]
    if keep is not None:
        weights.masked_fill_(~keep, 0.0)
    weights.div_(_exp_noise(noise_hash, keys))
    return weights.argmax(dim=-1)


_CPU_RACE_CHUNK = 16384


def _race_chunked(scaled: Tensor, keep: Tensor | None, noise_hash: Tensor, keys: Tensor, row_max: Tensor) -> Tensor:
    """The same race in vocabulary chunks (CPU): each chunk's hash, noise and weights stay
    in cache instead of streaming a dozen [B, V] int64 passes through memory. Element values
    are computed exactly as in one pass, and ties keep the first index, so the winner is
    the one-pass winner."""
    bsz, n = scaled.shape
    best_val = torch.full((bsz,), -1.0, dtype=torch.float32)
    best_idx = torch.zeros(bsz, dtype=torch.int64)
    for start in range(0, n, _CPU_RACE_CHUNK):
        sl = slice(start, start + _CPU_RACE_CHUNK)
        w = torch.exp(scaled[:, sl] - row_max)  # [B, C]
        if keep is not None:
            w.masked_fill_(~keep[:, sl], 0.0)
        w.div_(_exp_noise(noise_hash[sl] if noise_hash.dim() == 1 else noise_hash[:, sl], keys))
        val, idx = w.max(dim=-1)
        better = val > best_val
        best_val = torch.where(better, val, best_val)
        best_idx = torch.where(better, idx + start, best_idx)
    return best_idx


def apply_masks_(logits: Tensor, rows: Tensor, bits: Tensor) -> Tensor:
    """In place: ``logits[rows[i], t] = -inf`` wherever a grammar's bitmask ``bits[i]``
    disallows token t; returns ``logits``. On CUDA one Triton pass (no [R, V] temporaries)."""
    if logits.device.type == "cuda":
        from aserve.kernels.bitmask import apply_bitmask_

        return apply_bitmask_(logits, rows, bits)
    kernel = _cpu_kernel()
    if kernel is not None and logits.dtype == torch.float32 and logits.stride(1) == 1:
        # One C pass over the masks' words (the torch ops below build [R, V] temporaries:
        # ~11 ms for 16 rows of 262,144 tokens on this project's VM, against ~1 ms).
        rows, bits = rows.to(torch.int64).contiguous(), bits.to(torch.int32).contiguous()
        assert bits.shape[0] == rows.shape[0], "a mask per row"
        kernel.apply_bitmask(logits.data_ptr(), logits.stride(0), rows.data_ptr(), rows.shape[0], bits.data_ptr(),
                             bits.shape[1], logits.shape[1])  # fmt: skip
        return logits
    allowed = allowed_tokens(bits, logits.shape[1])  # [R, V] bool
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
    return logits


def sample(logits: Tensor, batch: SamplingBatch) -> SampleOutput:
    """Sample one token per row. logits: [B, V] float32 (not modified)."""
    vocab = logits.shape[1]
    device = logits.device

    # Logprobs always describe the raw model distribution, so take them first.
    chosen_logprobs: Tensor | None = None
    top_ids: Tensor | None = None
    top_logprobs: Tensor | None = None
    raw_logprobs: Tensor | None = None
    if batch.num_logprobs >= 0:
        raw_logprobs = torch.log_softmax(logits, dim=-1)  # [B, V]

    processed = logits
    if batch.any_penalty:
        processed = apply_penalties(
            logits,
            batch.prompt_tokens,
            batch.output_tokens,
            batch.repetition_penalty,
            batch.frequency_penalty,
            batch.presence_penalty,
        )

    if batch.bias_index is not None and batch.bias_values is not None:
        # Out of place: ``logits`` stays the model's (logprobs above were taken from it). The
        # (row, token) pairs are unique, so a gather and a plain scatter do (no accumulate).
        rows, cols = batch.bias_index[0], batch.bias_index[1]
        processed = processed.index_put((rows, cols), processed[rows, cols] + batch.bias_values)

    if batch.mask_rows is not None and batch.mask_bits is not None:
        # Structured outputs: tokens the row's grammar does not allow next are impossible.
        # In place on a copy: ``logits`` itself stays the model's.
        processed = apply_masks_(processed if processed is not logits else logits.clone(), batch.mask_rows,
                                 batch.mask_bits)  # fmt: skip

    greedy_tokens = processed.argmax(dim=-1)  # [B]
    if batch.all_greedy:
        token_ids = greedy_tokens
    else:
        is_greedy = batch.temperature < _GREEDY_EPS  # [B]
        # Greedy rows still go through the race (their result is discarded), so give them
        # a harmless temperature instead of dividing by 0.
        temp = torch.where(is_greedy, torch.ones_like(batch.temperature), batch.temperature)
        scaled = processed / temp[:, None]  # [B, V] fresh tensor
        keys = _row_keys(batch.seeds, batch.steps)  # [B]
        token_hash = _token_hash(vocab, device)  # [V]
        top_k = batch.top_k
        k_on = top_k > 0  # [B]
        k_eff = torch.where(k_on, top_k.clamp(max=vocab), vocab)  # [B] in [1, V]

        if batch.any_top_p and device.type == "cpu" and _CPU_NUCLEUS:
            sampled = _sample_nucleus_cpu(scaled, batch, k_eff, keys, token_hash)
        elif batch.any_top_p or (batch.any_top_k and batch.max_top_k <= 0):
            sampled = _sample_sorted(scaled, batch, k_eff, keys, token_hash)
        else:
            keep: Tensor | None = None
            if batch.any_top_k:
                # Only the k-th largest value per row is needed: a narrow topk beats a sort.
                kmax = min(batch.max_top_k, vocab)
                top_vals = torch.topk(scaled, kmax, dim=-1, sorted=True).values  # [B, kmax]
                kth = top_vals.gather(1, (k_eff.clamp(max=kmax) - 1)[:, None])  # [B, 1]
                # Rows without top-k keep everything; ties with the k-th value are kept.
                thresh = torch.where(k_on[:, None], kth, float("-inf"))
                keep = scaled >= thresh
            if batch.any_min_p:
                # p_i < min_p * p_max  <=>  l_i < l_max + log(min_p); log(0) = -inf keeps all.
                # The ratio to the max is unchanged by top-k renormalisation.
                row_max = scaled.max(dim=-1, keepdim=True).values  # [B, 1]
                min_keep = scaled >= row_max + torch.log(batch.min_p)[:, None]
                keep = min_keep if keep is None else keep & min_keep
            sampled = _race(scaled, keep, token_hash, keys)
        token_ids = torch.where(is_greedy, greedy_tokens, sampled)

    if raw_logprobs is not None:
        chosen_logprobs = raw_logprobs.gather(1, token_ids[:, None]).squeeze(1)  # [B]
        k = min(batch.num_logprobs, vocab)
        if k > 0:
            top = torch.topk(raw_logprobs, k, dim=-1, sorted=True)
            top_logprobs, top_ids = top.values, top.indices  # [B, K]
        else:
            top_logprobs = raw_logprobs.new_empty((logits.shape[0], 0))
            top_ids = torch.empty((logits.shape[0], 0), dtype=torch.int64, device=device)
    return SampleOutput(token_ids, chosen_logprobs, top_ids, top_logprobs)


# The head's top-k path hands the sampler each row's largest logits only: its top-k plus at
# least this many more, so that a tie at the k-th place that runs past them is seen (and the
# step falls back to the full logits) instead of being cut short. The width is a multiple of
# CANDIDATE_ALIGN, as the full race's chunks (rows of 16,384) are: torch 2.13's CPU exp and
# log give an element the same bits wherever it sits (checked for remainders of 1-39 and
# 1-7 threads), and the rounding keeps it so on a build whose remainder loop is scalar.
CANDIDATE_MARGIN = 16
CANDIDATE_ALIGN = 64
CANDIDATE_MAX_TOP_K = 256  # wider top-ks keep the full logits (the head's heaps grow with k)


def _tokens_only(batch: SamplingBatch | None) -> bool:
    """Whether ``sample`` reads the logits for the drawn tokens alone (host flags): no
    logprobs, penalties, logit bias (``min_tokens`` included) or grammar masks."""
    return (
        batch is not None and batch.num_logprobs < 0 and not batch.any_penalty and batch.bias_index is None
        and batch.mask_rows is None
    )  # fmt: skip


def plain_greedy(batch: SamplingBatch | None) -> bool:
    """Whether ``sample`` returns the logits' argmax and nothing else (every row greedy)."""
    return _tokens_only(batch) and batch is not None and batch.all_greedy


def candidate_width(batch: SamplingBatch | None) -> int:
    """How many candidates per row ``sample_candidates`` needs for this batch (host flags
    only), or 0 when the batch needs the full logits: some row samples without a top-k, or
    with top-p, penalties, a logit bias, a grammar or logprobs, or every row is greedy (the
    head's argmax covers that)."""
    if not _tokens_only(batch) or batch is None or batch.all_greedy or not batch.all_top_k or batch.any_top_p:
        return 0
    if not 0 < batch.max_top_k <= CANDIDATE_MAX_TOP_K:
        return 0
    return -(-(batch.max_top_k + CANDIDATE_MARGIN) // CANDIDATE_ALIGN) * CANDIDATE_ALIGN


def sample_candidates(values: Tensor, ids: Tensor, batch: SamplingBatch) -> Tensor | None:
    """``sample``'s tokens from each row's largest logits alone: values [B, C] float32 and
    their token ids [B, C] (in any order; C = ``candidate_width(batch)``, from the head's
    top-k kernel). Every token that ``sample`` could pick (the top-k after temperature, ties at
    the k-th place included, then min-p) is among them when the smallest candidate falls
    below the k-th value; then the race over the candidates in token-id order, with noise by
    token id, is the race over the whole row, and the tokens are ``sample``'s. Returns None when
    some row's candidates may miss a tie (the caller then samples from the full logits)."""
    order = ids.argsort(dim=-1)  # token-id order: the race's first-index rule on ties holds
    ids = ids.gather(1, order)
    values = values.gather(1, order)
    is_greedy = batch.temperature < _GREEDY_EPS  # [B]
    temp = torch.where(is_greedy, torch.ones_like(batch.temperature), batch.temperature)
    scaled = values / temp[:, None]  # the values ``sample`` scales, elementwise alike
    # A greedy row keeps its maximum (k = 1); the others their top-k.
    k_eff = torch.where(is_greedy, 1, batch.top_k.clamp(min=1, max=values.shape[1]))  # [B]
    kmax = min(batch.max_top_k, values.shape[1])
    kth = scaled.topk(kmax, dim=-1, sorted=True).values.gather(1, (k_eff.clamp(max=kmax) - 1)[:, None])  # [B, 1]
    # Division by a positive temperature keeps the order (and may merge values): a token
    # outside the candidates scales to at most the smallest candidate's value.
    # Non-finite logits (NaN, or inf, whose exp(inf - inf) the races treat apart) go the full way.
    if not bool((scaled.min(dim=-1, keepdim=True).values < kth).all()) or not bool(values.isfinite().all()):
        return None
    keep = scaled >= kth
    if batch.any_min_p:
        row_max = scaled.max(dim=-1, keepdim=True).values
        keep &= scaled >= row_max + torch.log(batch.min_p)[:, None]
    winner = _race(scaled, keep, _ids_hash(ids), _row_keys(batch.seeds, batch.steps))  # [B] candidate positions
    sampled = ids.gather(1, winner[:, None]).squeeze(1)
    greedy = ids.gather(1, values.argmax(dim=-1, keepdim=True)).squeeze(1)  # the first id among equal maxima
    return torch.where(is_greedy, greedy, sampled)


def _sample_sorted(scaled: Tensor, batch: SamplingBatch, k_eff: Tensor, keys: Tensor, token_hash: Tensor) -> Tensor:
    """Top-k / top-p / min-p on the descending sort of each row, then the race in sorted
    space. Noise is looked up by *vocab* index, so the draw equals the unsorted path's."""
    vocab = scaled.shape[1]
    sorted_l, sorted_idx = scaled.sort(dim=-1, descending=True)  # [B, V] each
    positions = torch.arange(vocab, device=scaled.device)  # [V]
    keep = positions[None, :] < k_eff[:, None]  # [B, V] top-k (all True where off)
    masked = sorted_l.masked_fill(~keep, float("-inf"))
    if batch.any_top_p:
        probs = torch.softmax(masked, dim=-1)  # [B, V] after top-k renormalisation
        cum_before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
        # Keep a token while the mass before it is < top_p: that is exactly the smallest
        # prefix reaching top_p, and position 0 (mass 0) always survives. Rows with top_p=1
        # skip the test, since float cumsum can hit 1.0 early and drop the tiny tail.
        p_on = batch.top_p < 1.0  # [B]
        keep &= ~p_on[:, None] | (cum_before < batch.top_p[:, None])
    if batch.any_min_p:
        min_keep = sorted_l >= sorted_l[:, :1] + torch.log(batch.min_p)[:, None]
        keep &= min_keep
    winner = _race(sorted_l, keep, token_hash[sorted_idx], keys)  # [B] sorted positions
    return sorted_idx.gather(1, winner[:, None]).squeeze(1)


_CPU_CANDIDATES = 1024
_CPU_NUCLEUS = True  # the CPU top-p shortcut below (it host-syncs, which costs nothing on a CPU)


def _sample_nucleus_cpu(
    scaled: Tensor, batch: SamplingBatch, k_eff: Tensor, keys: Tensor, token_hash: Tensor
) -> Tensor:
    """CPU top-p without sorting the whole vocabulary (a full sort of [B, 262144] costs far
    more than the model's step there).

    Each row's nucleus is found among its ``_CPU_CANDIDATES`` most likely tokens; the
    normaliser still covers the whole (top-k-masked) row, and noise is looked up by vocab
    index, so a row whose nucleus fits gets the full path's draw. Rows whose nucleus does
    not fit (flat distributions) take the full sort. The choice depends on the row alone,
    so results stay independent of the batch. The CPU may host-sync freely.
    """
    vocab = scaled.shape[1]
    k = min(_CPU_CANDIDATES, vocab)
    vals, idx = scaled.topk(k, dim=-1, sorted=True)  # [B, K]
    keep = torch.arange(k)[None, :] < k_eff[:, None]  # [B, K]
    masked = vals.masked_fill(~keep, float("-inf"))
    # Softmax normaliser after top-k: over the candidates when top-k lies inside them.
    lse = torch.where(k_eff <= k, torch.logsumexp(masked, dim=-1), torch.logsumexp(scaled, dim=-1))  # [B]
    probs = torch.exp(masked - lse[:, None])  # [B, K]
    cum = probs.cumsum(dim=-1)
    p_on = batch.top_p < 1.0
    keep &= ~p_on[:, None] | ((cum - probs) < batch.top_p[:, None])
    if batch.any_min_p:
        keep &= vals >= vals[:, :1] + torch.log(batch.min_p)[:, None]
    # The kept set ends inside the candidates when their mass reaches top_p (or top-k <= K).
    fits = torch.where(p_on, cum[:, -1] >= batch.top_p, k_eff <= k)  # [B]
    winner = _race(vals, keep, token_hash[idx], keys)  # [B] candidate positions
    tokens = idx.gather(1, winner[:, None]).squeeze(1)
    if bool(fits.all()):
        return tokens
    rows = (~fits).nonzero().squeeze(1)
    # Only the [B] knobs _sample_sorted reads (bias_index [2, N] and the grammar masks [R, ...]
    # are not per-row tensors and were applied to ``scaled`` already).
    sub = dataclasses.replace(batch, top_p=batch.top_p[rows], min_p=batch.min_p[rows])
    tokens[rows] = _sample_sorted(scaled[rows], sub, k_eff[rows], keys[rows], token_hash)
    return tokens

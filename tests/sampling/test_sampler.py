"""Tests for the batched, seeded, sync-free sampler."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from aserve.sampling import (
    SamplingBatch,
    apply_penalties,
    make_sampling_batch,
    sample,
    uniform_noise,
)
from aserve.sampling import noise as noise_mod
from aserve.sampling import sampler as sampler_mod


@dataclass(frozen=True)
class P:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()


def build(
    params: Sequence[P],
    seeds: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
    outputs: Sequence[Sequence[int]] | None = None,
) -> SamplingBatch:
    n = len(params)
    return make_sampling_batch(
        params,
        seeds if seeds is not None else list(range(n)),
        steps if steps is not None else [0] * n,
        prompts if prompts is not None else [[] for _ in range(n)],
        outputs if outputs is not None else [[] for _ in range(n)],
        "cpu",
    )


def tokens_over_seeds(logits_row: torch.Tensor, p: P, seeds: Sequence[int]) -> torch.Tensor:
    """One batch whose rows are the same logits with different seeds -> [N] tokens."""
    n = len(seeds)
    batch = build([p] * n, seeds=seeds)
    return sample(logits_row[None, :].expand(n, -1).contiguous(), batch).token_ids


# ------------------------------------------------------------------------------ greedy


def test_greedy_argmax() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.9], [5.0, 0.0, 0.0, 0.0], [-3.0, -2.0, -1.0, -4.0]])
    out = sample(logits, build([P(temperature=0.0)] * 3))
    assert out.token_ids.tolist() == [1, 0, 2]
    assert out.logprobs is None and out.top_ids is None and out.top_logprobs is None


def test_greedy_rows_in_mixed_batch_and_penalised_greedy() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # Row 0 greedy with presence penalty on token 1 -> 2.0 - 1.5 = 0.5 < 1.0 so token 0.
    batch = build(
        [P(temperature=0.0, presence_penalty=1.5), P(temperature=1.0)],
        outputs=[[1], []],
    )
    assert not batch.all_greedy and batch.any_penalty
    out = sample(logits, batch)
    assert out.token_ids[0].item() == 0


# ------------------------------------------------------------------------------ penalties


def test_apply_penalties_hand_computed() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5, 3.0]])
    prompt = torch.tensor([[0, 1, -1, -1]])  # tokens 0 and 1 seen in the prompt
    output = torch.tensor([[2, 2, 3, -1, -1]])  # token 2 twice, token 3 once
    rep = torch.tensor([2.0])
    freq = torch.tensor([0.5])
    pres = torch.tensor([0.25])
    out = apply_penalties(logits, prompt, output, rep, freq, pres)
    expected = [
        2.0 / 2.0,  # prompt-seen positive: divided
        -2.0 * 2.0,  # prompt-seen negative: multiplied
        1.0 / 2.0 - 0.5 * 2 - 0.25,  # output-seen twice
        -1.0 * 2.0 - 0.5 * 1 - 0.25,  # output-seen once
        0.5,  # unseen
        3.0,  # unseen
    ]
    torch.testing.assert_close(out, torch.tensor([expected]), rtol=0, atol=1e-6)
    assert logits[0, 0].item() == 2.0  # input untouched


def test_apply_penalties_prompt_does_not_count_for_frequency() -> None:
    logits = torch.zeros(2, 5)
    out = apply_penalties(
        logits + 1.0,
        torch.tensor([[4, 4, 4], [-1, -1, -1]]),
        torch.tensor([[-1], [0]]),
        torch.tensor([1.0, 1.0]),
        torch.tensor([1.0, 1.0]),
        torch.tensor([1.0, 1.0]),
    )
    # Row 0: prompt-only tokens are untouched by frequency/presence. Row 1: token 0 once.
    assert out.tolist() == [[1.0] * 5, [1.0 - 1.0 - 1.0, 1.0, 1.0, 1.0, 1.0]]


def test_penalties_wired_into_sample() -> None:
    logits = torch.tensor([[5.0, 4.0, 0.0]])
    batch = build([P(temperature=0.0, repetition_penalty=2.0)], prompts=[[0]])
    assert batch.prompt_tokens is not None
    # 5/2 = 2.5 < 4 -> token 1.
    assert sample(logits, batch).token_ids.tolist() == [1]


# ------------------------------------------------------------------------------ filters


def test_top_k_two_never_leaves_top_two() -> None:
    logits = torch.tensor([0.0, 1.0, 3.0, 2.9, 0.5, 2.0, -1.0, 1.5])
    toks = tokens_over_seeds(logits, P(top_k=2), list(range(3000)))
    assert set(toks.tolist()) == {2, 3}


def test_top_k_sorted_path_matches_topk_path() -> None:
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(0))
    seeds = list(range(500))
    fast = tokens_over_seeds(logits[0], P(top_k=5), seeds)
    batch = build([P(top_k=5)] * len(seeds), seeds=seeds)
    batch.max_top_k = 0  # unknown -> full sort path
    slow = sample(logits.expand(len(seeds), -1).contiguous(), batch).token_ids
    assert torch.equal(fast, slow)


def test_top_p_keeps_exact_nucleus() -> None:
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    logits = probs.log()
    # Sorted: 0.4 (1), 0.3 (3), 0.15 (4), 0.1 (2), 0.05 (0). Cumulative 0.4, 0.7, 0.85, ...
    # top_p=0.7 -> {1, 3}; top_p=0.71 -> {1, 3, 4}; tiny top_p -> only the top token.
    for top_p, nucleus in [(0.7 - 1e-4, {1, 3}), (0.71, {1, 3, 4}), (0.01, {1})]:
        toks = tokens_over_seeds(logits, P(top_p=top_p), list(range(2000)))
        assert set(toks.tolist()) == nucleus, top_p


def test_top_p_combined_with_top_k() -> None:
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    # top_k=3 renormalises {0.4, 0.3, 0.15} -> cumulative 0.47, 0.82, 1; top_p=0.8 -> 2 kept.
    toks = tokens_over_seeds(probs.log(), P(top_k=3, top_p=0.8), list(range(2000)))
    assert set(toks.tolist()) == {1, 3}


def test_min_p_drop_set() -> None:
    probs = torch.tensor([0.5, 0.2, 0.12, 0.1, 0.08])
    # min_p=0.22 -> threshold 0.11: keep {0, 1, 2}; drop 0.1 and 0.08.
    toks = tokens_over_seeds(probs.log(), P(min_p=0.22), list(range(3000)))
    assert set(toks.tolist()) == {0, 1, 2}
    # Also through the sorting path (top-p present but inactive for these rows' mass).
    toks = tokens_over_seeds(probs.log(), P(min_p=0.22, top_p=0.999), list(range(3000)))
    assert set(toks.tolist()) == {0, 1, 2}


def test_temperature_to_zero_is_argmax() -> None:
    logits = torch.tensor([0.3, 1.2, 1.1, -0.5, 1.15])
    toks = tokens_over_seeds(logits, P(temperature=1e-3), list(range(500)))
    assert set(toks.tolist()) == {1}


def test_high_temperature_flattens() -> None:
    logits = torch.tensor([0.0, 0.08, 0.0, 0.0])
    toks = tokens_over_seeds(logits, P(temperature=2.0), list(range(4000)))
    freq = torch.bincount(toks, minlength=4).double() / 4000
    assert (freq - 0.25).abs().max() < 0.04


# ------------------------------------------------------------------------------ logprobs


def test_logprobs_match_float64_log_softmax_and_order() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 30, generator=gen) * 3
    batch = build(
        [
            P(temperature=0.0, logprobs=4, presence_penalty=1.0),
            P(temperature=0.7, logprobs=2),
            P(top_p=0.9),
        ],
        outputs=[[0], [], [5]],
    )
    assert batch.num_logprobs == 4
    out = sample(logits, batch)
    assert out.logprobs is not None and out.top_ids is not None and out.top_logprobs is not None
    x = logits.numpy().astype(np.float64)
    ref = x - x.max(1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(1, keepdims=True))  # raw log_softmax, no penalties
    toks = out.token_ids.numpy()
    np.testing.assert_allclose(out.logprobs.numpy(), ref[np.arange(3), toks], atol=1e-5)
    assert out.top_ids.shape == (3, 4)
    order = np.argsort(-ref, axis=1)[:, :4]
    np.testing.assert_array_equal(out.top_ids.numpy(), order)
    np.testing.assert_allclose(out.top_logprobs.numpy(), np.take_along_axis(ref, order, 1), atol=1e-5)
    assert (np.diff(out.top_logprobs.numpy(), axis=1) <= 0).all()


def test_logprobs_zero_alternatives() -> None:
    out = sample(torch.randn(2, 10), build([P(logprobs=0), P()]))
    assert out.top_ids is not None and out.top_ids.shape == (2, 0)
    assert out.top_logprobs is not None and out.top_logprobs.shape == (2, 0)
    assert out.logprobs is not None and out.logprobs.shape == (2,)


# ------------------------------------------------------------------------------ distribution


@pytest.mark.parametrize("mode", ["seeds", "steps", "top_p_path"])
def test_distribution_matches_probabilities(mode: str) -> None:
    probs = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
    logits = torch.tensor(np.log(probs), dtype=torch.float32)
    n = 20000
    p = P(top_p=0.9999) if mode == "top_p_path" else P()
    seeds = [12345] * n if mode == "steps" else list(range(n))
    steps = list(range(n)) if mode == "steps" else [7] * n
    batch = build([p] * n, seeds=seeds, steps=steps)
    toks = sample(logits[None, :].expand(n, -1).contiguous(), batch).token_ids
    freq = np.bincount(toks.numpy(), minlength=len(probs)) / n
    assert np.abs(freq - probs).max() < 0.012
    chi2 = float((((freq - probs) * n) ** 2 / (probs * n)).sum())
    assert chi2 < 24.3  # p = 0.001 critical value for 7 degrees of freedom


def test_uniform_noise_is_uniform_and_in_open_interval() -> None:
    seeds = torch.arange(64, dtype=torch.int64) * 7919 - 100
    steps = torch.arange(64, dtype=torch.int64)
    ids = torch.arange(4096, dtype=torch.int64)[None, :].expand(64, -1)
    u = uniform_noise(seeds, steps, ids).double()
    assert (u > 0).all() and (u < 1).all()
    assert abs(u.mean().item() - 0.5) < 0.002
    hist = torch.histc(u, bins=16, min=0, max=1) / u.numel()
    assert (hist - 1 / 16).abs().max() < 0.002
    # Adjacent tokens and adjacent steps are uncorrelated.
    assert abs(np.corrcoef(u[:, :-1].flatten(), u[:, 1:].flatten())[0, 1]) < 0.01
    assert abs(np.corrcoef(u[:-1].flatten(), u[1:].flatten())[0, 1]) < 0.01


# ------------------------------------------------------------------------------ independence


_OTHER_PARAMS = st.sampled_from(
    [
        P(),
        P(temperature=0.0),
        P(top_k=3),
        P(top_p=0.8),
        P(min_p=0.1),
        P(temperature=0.5, top_k=10, top_p=0.9),
        P(presence_penalty=0.5, logprobs=2),
    ]
)
_MY_PARAMS = st.sampled_from([P(), P(top_k=4), P(top_p=0.9), P(min_p=0.05), P(temperature=1.7)])


@settings(max_examples=60, deadline=None)
@given(
    my=_MY_PARAMS,
    seed=st.integers(-(2**63), 2**63 - 1),
    step=st.integers(0, 10_000),
    row_seed=st.integers(0, 2**31),
    others=st.lists(st.tuples(_OTHER_PARAMS, st.integers(0, 2**40)), max_size=7),
    position=st.integers(0, 7),
)
def test_batch_independence(
    my: P, seed: int, step: int, row_seed: int, others: list[tuple[P, int]], position: int
) -> None:
    vocab = 24
    gen = torch.Generator().manual_seed(row_seed)
    row = torch.randn(vocab, generator=gen) * 2
    alone = sample(row[None, :], build([my], seeds=[seed], steps=[step])).token_ids[0]

    pos = min(position, len(others))
    params = [o[0] for o in others]
    seeds = [o[1] for o in others]
    params.insert(pos, my)
    seeds.insert(pos, seed)
    n = len(params)
    logits = torch.randn(n, vocab, generator=gen) * 2
    logits[pos] = row
    outputs = [[1, 2] for _ in range(n)]
    outputs[pos] = []  # penalties of the other rows must not leak into ours
    batch = build(params, seeds=seeds, steps=[step + i for i in range(n)], outputs=outputs)
    batch.steps[pos] = step
    together = sample(logits, batch).token_ids[pos]
    assert together.item() == alone.item()


def test_seeds_and_steps_change_the_draw() -> None:
    logits = torch.zeros(1, 50)  # uniform
    by_seed = tokens_over_seeds(logits[0], P(), list(range(200)))
    assert len(set(by_seed.tolist())) > 40
    n = 200
    by_step = sample(
        logits.expand(n, -1).contiguous(), build([P()] * n, seeds=[99] * n, steps=list(range(n)))
    ).token_ids
    assert len(set(by_step.tolist())) > 40
    # Same (seed, step) twice -> same token.
    again = tokens_over_seeds(logits[0], P(), list(range(200)))
    assert torch.equal(by_seed, again)


# ------------------------------------------------------------------------------ no host sync


class _NoHostSync(TorchDispatchMode):  # type: ignore[no-untyped-call]  # untyped torch base
    """Fails on the op every host read of a device value (``.item()``, ``.tolist()``, Python
    ``bool``/``int`` of a tensor, data-dependent shapes) goes through."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        forbidden = {
            torch.ops.aten._local_scalar_dense.default,
            torch.ops.aten.nonzero.default,
            torch.ops.aten.masked_select.default,
        }
        if func in forbidden:
            raise AssertionError(f"host sync via {func}")
        return func(*args, **(kwargs or {}))


def _all_paths_batches(vocab: int) -> list[tuple[torch.Tensor, SamplingBatch]]:
    gen = torch.Generator().manual_seed(3)
    cases = [
        [P(temperature=0.0)] * 3,
        [P(), P(temperature=0.0), P(temperature=0.3)],
        [P(top_k=5), P(), P(min_p=0.1)],
        [P(top_p=0.8, top_k=4, min_p=0.05, logprobs=3), P(temperature=0.0), P()],
        [P(repetition_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1, logprobs=0)] * 3,
        [P(temperature=0.0, logit_bias=((1, 5.0), (2, -3.0))), P(logit_bias=((0, 100.0),), logprobs=1), P()],
    ]
    out = []
    for params in cases:
        batch = build(params, prompts=[[1, 2]] * 3, outputs=[[3], [], [4, 4]])
        out.append((torch.randn(3, vocab, generator=gen), batch))
    return out


def test_logit_bias_is_a_sparse_add_before_sampling() -> None:
    """Greedy rows pick the argmax of logits + bias (a dense add, done here independently);
    +100 forces a sampled row's token; logits and logprobs stay the model's."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 64, generator=gen)
    before = logits.clone()
    top2 = torch.topk(logits[0], 2).indices.tolist()
    params = [
        P(temperature=0.0, logit_bias=((top2[0], -100.0), (top2[1], -100.0))),  # the top two pushed out
        P(temperature=0.0, logit_bias=((9, 2.5),)),
        P(temperature=1.0, logit_bias=((17, 100.0),), logprobs=0),
        P(temperature=0.0),
    ]
    out = sample(logits, build(params, seeds=[1, 2, 3, 4]))
    dense = torch.zeros_like(logits)
    for i, p in enumerate(params):
        for tok, val in p.logit_bias:
            dense[i, tok] += val
    expected = (logits + dense).argmax(-1)
    got = out.token_ids.tolist()
    assert got[0] == expected[0] and got[0] not in top2
    assert got[1] == expected[1] and got[3] == logits[3].argmax()
    assert got[2] == 17
    assert torch.equal(logits, before)
    assert out.logprobs is not None
    assert out.logprobs[2].item() == pytest.approx(torch.log_softmax(logits[2], -1)[17].item())


def test_banned_ids_override_bias_and_are_never_drawn() -> None:
    """``banned_list`` (a request under min_tokens bans its stop ids): never drawn, greedy or
    sampled, even where the request's own logit_bias pushes the same id up."""
    logits = torch.zeros(3, 32)
    logits[:, 4] = 50.0  # the id to ban dominates
    params = [P(temperature=0.0, logit_bias=((4, 100.0),)), P(temperature=1.0), P(temperature=0.0)]
    batch = make_sampling_batch(params, [1, 2, 3], [0, 0, 0], [[1]] * 3, [[]] * 3, "cpu", [{4, 5}, {4}, set()])
    assert batch.bias_index is not None and batch.bias_index.shape[1] == 3  # (0, 4), (0, 5), (1, 4): unique
    tokens = sample(logits, batch).token_ids.tolist()
    assert tokens[0] not in (4, 5) and tokens[1] != 4 and tokens[2] == 4


def test_no_host_sync_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # The device paths (what CUDA runs); the CPU-only top-p shortcut syncs on purpose.
    monkeypatch.setattr(sampler_mod, "_CPU_NUCLEUS", False)
    with _NoHostSync():  # type: ignore[no-untyped-call]
        # Sanity: the guard really trips on .item().
        with pytest.raises(AssertionError, match="host sync"):
            torch.ones(1).item()
        for logits, batch in _all_paths_batches(64):
            sample(logits, batch)


def test_source_has_no_sync_calls() -> None:
    src = inspect.getsource(sampler_mod.sample) + inspect.getsource(sampler_mod._sample_sorted)
    for bad in (".item()", ".tolist()", ".cpu()", ".numpy()"):
        assert bad not in src


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_no_sync_and_matches_cpu() -> None:
    for logits, batch in _all_paths_batches(1000):
        fields: dict[str, Any] = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in vars(batch).items()}
        cuda_batch = SamplingBatch(**fields)
        logits_cuda = logits.cuda()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out_cuda = sample(logits_cuda, cuda_batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        out_cpu = sample(logits, batch)
        assert torch.equal(out_cuda.token_ids.cpu(), out_cpu.token_ids)
    # The noise itself is integer-exact across devices.
    seeds = torch.tensor([0, -1, 2**62, 17])
    steps = torch.tensor([0, 5, 9, 100])
    ids = torch.arange(5000)[None, :].expand(4, -1)
    u_cpu = uniform_noise(seeds, steps, ids)
    u_cuda = uniform_noise(seeds.cuda(), steps.cuda(), ids.cuda()).cpu()
    assert torch.equal(u_cpu, u_cuda)


# ------------------------------------------------------------------------------ batch builder


def test_make_sampling_batch_flags_and_padding() -> None:
    batch = build(
        [
            P(temperature=0.0, top_p=0.5, top_k=7),  # greedy: filters ignored for flags
            P(top_k=-1, logprobs=3),
            P(top_k=20, repetition_penalty=1.2),
        ],
        seeds=[1, 2, 3],
        steps=[0, 4, 9],
        prompts=[[5], [6, 7, 8], []],
        outputs=[[1, 2], [], [3]],
    )
    assert batch.temperature.tolist() == [0.0, 1.0, 1.0]
    assert batch.top_k.tolist() == [7, 0, 20]
    assert (batch.any_top_k, batch.any_top_p, batch.any_min_p) == (True, False, False)
    assert batch.max_top_k == 20 and batch.any_penalty and not batch.all_greedy
    assert batch.num_logprobs == 3
    assert batch.prompt_tokens is not None and batch.output_tokens is not None
    assert batch.prompt_tokens.tolist() == [[5, -1, -1], [6, 7, 8], [-1, -1, -1]]
    assert batch.output_tokens.tolist() == [[1, 2], [-1, -1], [3, -1]]

    plain = build([P(), P(temperature=0.0)])
    assert plain.prompt_tokens is None and plain.output_tokens is None
    assert not plain.any_penalty and plain.num_logprobs == -1


def test_make_sampling_batch_accepts_engine_params() -> None:
    from aserve.sampling_params import SamplingParams

    batch = make_sampling_batch([SamplingParams()], [1], [0], [[1]], [[]], "cpu")
    assert batch.temperature.tolist() == [1.0]


# ------------------------------------------------------------------------------ timing


def _time_ms(logits: torch.Tensor, batch: SamplingBatch, reps: int = 3) -> float:
    import time

    sample(logits, batch)  # warm-up (token-hash cache, allocator)
    start = time.perf_counter()
    for _ in range(reps):
        sample(logits, batch)
    return (time.perf_counter() - start) / reps * 1000


def _benchmark() -> None:
    vocab = 262144
    cases = [
        ("greedy", P(temperature=0.0)),
        ("temp", P()),
        ("top_k50", P(top_k=50)),
        ("min_p", P(min_p=0.05)),
        ("top_p", P(top_p=0.9)),
        ("penalty", P(presence_penalty=0.5, repetition_penalty=1.1)),
        ("logprob5", P(logprobs=5)),
    ]
    for b in (16, 64):
        logits = torch.randn(b, vocab)
        for name, p in cases:
            batch = build([p] * b, prompts=[list(range(500))] * b, outputs=[list(range(200))] * b)
            print(f"B={b:3d} V={vocab} {name:8s}: {_time_ms(logits, batch):8.1f} ms/call")


if __name__ == "__main__":
    # Benchmark: `python -m tests.sampling.test_sampler`.
    _benchmark()


@pytest.mark.parametrize("temperature", [0.3, 1.0, 5.0])
def test_cpu_nucleus_shortcut_equals_full_sort(monkeypatch: pytest.MonkeyPatch, temperature: float) -> None:
    """The CPU top-p shortcut draws the same tokens as the full sort, peaked rows (nucleus
    among the candidates) and flat rows (fallback to the sort) alike, mixed in one batch."""
    g = torch.Generator().manual_seed(int(temperature * 10))
    vocab, rows = 5000, 48
    logits = torch.randn(rows, vocab, generator=g) * torch.linspace(0.1, 12.0, rows)[:, None]

    class P:
        def __init__(self, top_p: float, top_k: int, min_p: float) -> None:
            self.temperature, self.top_p, self.top_k, self.min_p = temperature, top_p, top_k, min_p
            self.repetition_penalty, self.frequency_penalty, self.presence_penalty = 1.0, 0.0, 0.0
            self.logprobs = None
            self.logit_bias: tuple[tuple[int, float], ...] = ()

    params = [
        P([0.5, 0.9, 0.99, 1.0][i % 4], [0, 0, 40, 3000][i % 4 if i % 3 else 0], [0.0, 0.05][i % 2])
        for i in range(rows)
    ]
    batch = make_sampling_batch(params, list(range(rows)), [7] * rows, [[1]] * rows, [[]] * rows, "cpu")
    fast = sample(logits, batch).token_ids
    monkeypatch.setattr(sampler_mod, "_CPU_NUCLEUS", False)
    full = sample(logits, batch).token_ids
    assert torch.equal(fast, full)


def test_the_largest_hash_value_does_not_win_the_race() -> None:
    """Seed 49 at step 0 maps token 164644 to a hash >= 0xFFFFFF00: the largest uniform.
    With 24 bits plus the half-step offset that uniform rounded to exactly 1.0, E == 0, and
    the token won the race whatever its probability (NaN'd it when masked): about once per
    2**24 tokens, ~1.6% of the rows at a 262144-token vocabulary."""
    vocab, seed, special = 262144, 49, 164644
    key = noise_mod._row_keys(torch.tensor([seed]), torch.tensor([0]))
    th = noise_mod._token_hash(vocab, torch.device("cpu"))
    assert int(noise_mod._mix32(th[special] ^ key)[0]) >= 0xFFFFFF00, "the edge case moved; pick another seed"
    noise = noise_mod._exp_noise(th, key)
    assert torch.isfinite(noise).all() and (noise > 0).all()
    logits = torch.zeros(2, vocab)
    logits[:, special] = -30.0  # practically impossible token
    logits[:, :100] = 5.0

    class P:
        temperature, top_p, min_p = 1.0, 1.0, 0.0
        repetition_penalty, frequency_penalty, presence_penalty = 1.0, 0.0, 0.0
        logprobs = None
        logit_bias: tuple[tuple[int, float], ...] = ()

        def __init__(self, top_k: int) -> None:
            self.top_k = top_k

    batch = make_sampling_batch([P(0), P(50)], [seed, seed], [0, 0], [[1]] * 2, [[]] * 2, "cpu")
    tokens = sample(logits, batch).token_ids.tolist()
    assert (tokens[0] != special and tokens[0] < 100) or logits[0, tokens[0]] == 0.0
    assert tokens[1] < 100, "a token outside top-k was drawn"


def test_large_vocab_draws_stay_inside_top_k_and_are_not_flat() -> None:
    """Many (seed, step) rows at the real vocabulary size: every draw respects top-k, and
    a peaked distribution is sampled near its mode (the U == 1 bug picked any token)."""
    vocab, rows = 262144, 96
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=g) * 3

    class P:
        temperature, top_p, min_p = 0.7, 1.0, 0.0
        repetition_penalty, frequency_penalty, presence_penalty = 1.0, 0.0, 0.0
        logprobs = None
        logit_bias: tuple[tuple[int, float], ...] = ()

        def __init__(self, top_k: int) -> None:
            self.top_k = top_k

    params = [P(50 if i % 2 else 0) for i in range(rows)]
    batch = make_sampling_batch(
        params, list(range(rows)), [i * 7 for i in range(rows)], [[1]] * rows, [[]] * rows, "cpu"
    )
    tokens = sample(logits, batch).token_ids
    top50 = torch.topk(logits, 50).indices
    for i in range(1, rows, 2):
        assert tokens[i] in top50[i], f"row {i}: token outside top-k"
    # Without top-k, temperature 0.7 over N(0, 9) logits still concentrates on the top ~1%.
    ranks = [(logits[i] > logits[i, tokens[i]]).sum().item() for i in range(0, rows, 2)]
    assert max(ranks) < vocab // 50, f"a draw from the far tail: ranks {sorted(ranks)[-3:]}"


@pytest.mark.parametrize("kind", ["temperature", "top_k", "min_p"])
def test_cpu_chunked_race_equals_one_pass(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    g = torch.Generator().manual_seed(11)
    vocab, rows = 5000, 24
    logits = torch.randn(rows, vocab, generator=g) * 2

    class P:
        temperature, top_p = 0.8, 1.0
        repetition_penalty, frequency_penalty, presence_penalty = 1.0, 0.0, 0.0
        logprobs = None
        logit_bias: tuple[tuple[int, float], ...] = ()
        top_k = 40 if kind == "top_k" else 0
        min_p = 0.05 if kind == "min_p" else 0.0

    batch = make_sampling_batch([P()] * rows, list(range(rows)), [5] * rows, [[1]] * rows, [[]] * rows, "cpu")
    monkeypatch.setattr(sampler_mod, "_CPU_RACE_CHUNK", 10**9)
    one_pass = sample(logits, batch).token_ids
    monkeypatch.setattr(sampler_mod, "_CPU_RACE_CHUNK", 512)  # 10 chunks, the last one partial
    chunked = sample(logits, batch).token_ids
    assert torch.equal(one_pass, chunked)


# ------------------------------------------------------------------ the head's candidates


def _candidates(logits: torch.Tensor, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top ``width`` logits and ids, shuffled (the head's kernel keeps no order)."""
    vals, ids = logits.topk(width, dim=-1)
    perm = torch.stack([torch.randperm(width, generator=torch.Generator().manual_seed(seed + r))
                        for r in range(logits.shape[0])])  # fmt: skip
    return vals.gather(1, perm), ids.gather(1, perm)


def test_candidate_width_only_for_top_k_batches_that_read_nothing_else() -> None:
    assert sampler_mod.candidate_width(build([P(top_k=40), P(temperature=0.0)])) == 64
    assert sampler_mod.candidate_width(build([P(top_k=40, min_p=0.1), P(top_k=5)])) == 64
    assert sampler_mod.candidate_width(build([P(top_k=49)])) == 128  # 49 + 16 rounded up to 64s
    banned = make_sampling_batch([P(top_k=40)], [0], [0], [[]], [[]], "cpu", banned_list=[{1}])  # min_tokens
    grammar = make_sampling_batch([P(top_k=40)], [0], [0], [[]], [[]], "cpu", masks=([0], None))  # split launch
    assert sampler_mod.candidate_width(banned) == sampler_mod.candidate_width(grammar) == 0
    for params in (
        [P(temperature=0.0)],  # all greedy: the head's argmax
        [P(top_k=40), P()],  # a row without top-k
        [P(top_k=40, top_p=0.9)],
        [P(top_k=40, presence_penalty=0.5)],
        [P(top_k=40, logprobs=0)],
        [P(top_k=40, logit_bias=((3, 1.0),))],
        [P(top_k=sampler_mod.CANDIDATE_MAX_TOP_K + 1)],
    ):
        assert sampler_mod.candidate_width(build(params)) == 0, params


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    ks=st.lists(st.sampled_from([0, 1, 2, 5, 40, 100]), min_size=1, max_size=6),
    temp=st.sampled_from([0.05, 0.7, 1.0, 1.5, 4.0]),
    min_p=st.sampled_from([0.0, 0.05]),
    coarse=st.booleans(),
)
def test_sampling_from_the_candidates_is_sampling_from_the_logits(
    seed: int, ks: list[int], temp: float, min_p: float, coarse: bool
) -> None:
    """``sample_candidates`` on each row's top (k + margin) logits draws ``sample``'s tokens on
    the full rows: greedy rows (k = 0 here) and top-k rows mixed, any temperature, min-p, and
    coarse logits (quantized to steps of 0.5: many ties, some past the candidates, where it
    must answer None rather than a different token)."""
    g = torch.Generator().manual_seed(seed)
    vocab = 3000 if seed % 2 else 40_000  # one pass, or the CPU's chunked race (over 16,384)
    logits = torch.randn(len(ks), vocab, generator=g) * 3
    if coarse:
        logits = (logits * 2).round() / 2
    params = [P(temperature=0.0) if k == 0 else P(temperature=temp, top_k=k, min_p=min_p) for k in ks]
    if all(k == 0 for k in ks):
        params[0] = P(temperature=temp, top_k=3)
    batch = build(params, seeds=[seed + i for i in range(len(ks))], steps=[i * 7 for i in range(len(ks))])
    width = sampler_mod.candidate_width(batch)
    assert width >= batch.max_top_k + sampler_mod.CANDIDATE_MARGIN and width % sampler_mod.CANDIDATE_ALIGN == 0
    got = sampler_mod.sample_candidates(*_candidates(logits, width, seed), batch)
    want = sample(logits, batch).token_ids
    if got is None:  # only where a tie at some row's k-th value reaches the last candidate
        scaled = logits / torch.where(batch.temperature > 0, batch.temperature, 1.0)[:, None]
        top = scaled.topk(width, dim=-1).values
        k_eff = torch.where(batch.temperature > 0, batch.top_k, 1)
        assert bool((top[:, -1] == top.gather(1, (k_eff - 1)[:, None])[:, 0]).any())
    else:
        assert torch.equal(got, want)


def test_non_finite_candidates_fall_back() -> None:
    """inf: the full race's weight there is exp(inf - inf) = NaN, which never wins it, while an
    argmax over the candidates would take it; NaN likewise. Both go the full way."""
    logits = torch.randn(2, 20_000, generator=torch.Generator().manual_seed(3))
    logits[0, 17_000] = float("inf")
    logits[1, 123] = float("nan")
    batch = build([P(top_k=40), P(top_k=40)])
    assert sampler_mod.sample_candidates(*_candidates(logits, sampler_mod.candidate_width(batch), 0), batch) is None


def test_a_tie_past_the_candidates_falls_back() -> None:
    logits = torch.zeros(1, 500)
    logits[0, :3] = torch.tensor([5.0, 4.0, 3.0])  # the 4th value onwards: 497 tokens tie at 0
    batch = build([P(top_k=4)])
    width = sampler_mod.candidate_width(batch)
    assert sampler_mod.sample_candidates(*_candidates(logits, width, 0), batch) is None
    batch = build([P(top_k=3)])  # the 3rd value is the last of its kind: exact
    got = sampler_mod.sample_candidates(*_candidates(logits, sampler_mod.candidate_width(batch), 0), batch)
    assert got is not None and torch.equal(got, sample(logits, batch).token_ids)


@pytest.mark.skipif(noise_mod._cpu_kernel() is None, reason="the C extension is not built")
def test_the_c_uniforms_are_the_torch_ops_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_exp_noise`` on a CPU takes its uniforms from one C loop; with the extension hidden it
    runs the torch ops. Same bits, for a shared row of token hashes (the full race) and for a
    row of hashes each (the head's candidates), keys at both ends of 32 bits included."""
    vocab = 70_000
    hashes = noise_mod._token_hash(vocab, torch.device("cpu"))
    seeds = torch.tensor([0, 1, -1, 2**62 + 12345, -(2**40)], dtype=torch.int64)
    keys = noise_mod._row_keys(seeds, torch.tensor([0, 7, 2**32 - 1, 5, 123456789]))
    keys[0] = 0
    keys[1] = 2**32 - 1
    per_row = hashes[torch.randint(0, vocab, (5, 333), generator=torch.Generator().manual_seed(1))]
    fast = [noise_mod._exp_noise(hashes, keys), noise_mod._exp_noise(per_row, keys)]
    monkeypatch.setattr(noise_mod, "_cpu_kernel", lambda: None)
    slow = [noise_mod._exp_noise(hashes, keys), noise_mod._exp_noise(per_row, keys)]
    for f, s in zip(fast, slow, strict=True):
        assert f.dtype == torch.float32 and torch.equal(f, s)
        assert bool((f > 0).all()) and bool(f.isfinite().all())


@pytest.mark.skipif(noise_mod._cpu_kernel() is None, reason="the C extension is not built")
def test_the_c_bitmask_is_the_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """``apply_masks_`` on a CPU sends disallowed tokens to -inf in one C pass; with the
    extension hidden it runs the torch ops. Same logits: words all set, all clear and mixed,
    a vocabulary that ends mid-word, rows in any order, a row stride wider than the vocabulary
    (logits sliced from a wider buffer), unconstrained rows left alone."""
    gen = torch.Generator().manual_seed(3)
    vocab, words = 1000, 32  # 1024 bits: the last word's upper 24 bits lie past the vocabulary
    wide = torch.randn(7, vocab + 9, generator=gen)
    bits = torch.randint(-(2**31), 2**31 - 1, (4, words), dtype=torch.int32, generator=gen)
    bits[:, 0] = 0
    bits[:, 1] = -1
    bits[2] = 0  # a row that allows nothing
    rows = torch.tensor([5, 0, 3, 6])
    fast = wide.clone()
    sampler_mod.apply_masks_(fast[:, :vocab], rows, bits)
    monkeypatch.setattr(sampler_mod, "_cpu_kernel", lambda: None)
    slow = wide.clone()
    sampler_mod.apply_masks_(slow[:, :vocab], rows, bits)
    assert torch.equal(fast, slow)
    assert torch.equal(fast[:, vocab:], wide[:, vocab:]) and torch.equal(fast[[1, 2, 4]], wide[[1, 2, 4]])
    assert bool(fast[3, :vocab].isneginf().all()) and bool(fast[5, :32].isneginf().all())
    assert int(fast.isneginf().sum()) > 0 and torch.equal(fast[0, 32:64], wide[0, 32:64])

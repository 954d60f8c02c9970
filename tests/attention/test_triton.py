"""Triton paged attention vs the torch reference, on random shapes.

On a machine without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1,
set before the kernels are defined) at small sizes; on the GPU they compile and run for real.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from aserve.attention.metadata import AttentionMetadata, build_metadata  # noqa: E402
from aserve.attention.reference import paged_attention  # noqa: E402
from aserve.attention.triton_paged import DecodeLaunch, _decode, attend_triton, paged_attention_triton  # noqa: E402

# Triton's CPU interpreter runs these slowly on a CPU (quick set: `pytest`; these: `pytest -m slow`).
pytestmark = pytest.mark.slow

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(seed: int, heads: int, kv_heads: int, dim: int, prefix: list[int], extend: list[int], window: int | None):
    g = torch.Generator().manual_seed(seed)
    rows = random.Random(seed).sample(range(8), len(prefix))
    slots_total = 8 * 128
    perm = torch.randperm(slots_total, generator=g)  # shuffled, non-contiguous slots
    table = torch.zeros(8, 128, dtype=torch.int64)
    for i, r in enumerate(rows):
        table[r] = perm[i * 128 : (i + 1) * 128]
    table = table.to(DEVICE)
    meta = build_metadata(table, rows, prefix, extend, DEVICE)
    t = sum(extend)
    q = torch.randn(t, heads, dim, generator=g).to(DEVICE)
    k = torch.randn(t, kv_heads, dim, generator=g).to(DEVICE)
    v = torch.randn(t, kv_heads, dim, generator=g).to(DEVICE)
    kc = torch.randn(slots_total + 1, kv_heads, dim, generator=g).to(DEVICE)  # old context: random
    vc = torch.randn(slots_total + 1, kv_heads, dim, generator=g).to(DEVICE)
    ref = paged_attention(q, k, v, kc.clone(), vc.clone(), meta, dim**-0.5, window)
    # Fresh metadata: the reference caches layout tensors on its metadata object.
    meta2 = build_metadata(table, rows, prefix, extend, DEVICE)
    kc2, vc2 = kc.clone(), vc.clone()
    out = paged_attention_triton(q, k, v, kc2, vc2, meta2, dim**-0.5, window)
    return out, ref, (kc2, vc2, meta2, q)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "window"),
    [(4, 1, 32, None), (4, 2, 64, None), (2, 2, 32, 5), (4, 1, 64, 9), (8, 2, 128, None), (4, 1, 256, 9)],
)
def test_decode_matches_reference(heads: int, kv_heads: int, dim: int, window: int | None) -> None:
    prefix = [0, 5, 40, 77]  # 0: a sequence whose only key is its own new token
    out, ref, _ = _case(1, heads, kv_heads, dim, prefix, [1] * 4, window)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(out).all()


@pytest.fixture
def programs_out_of_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """In Triton's interpreter, run a launch's programs in a shuffled order rather than the
    grid's, so that which program of a (token, KV head) arrives last varies (the inline merge's
    counting). Nothing on a GPU, whose order is its own."""
    if DEVICE == "cuda":
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    set_dim, set_idx = builder.set_grid_dim, builder.set_grid_idx
    order: dict[tuple[int, int, int], tuple[int, int, int]] = {}

    def shuffled_dim(*grid: int) -> None:
        set_dim(*grid)
        ids = [(x, y, z) for x in range(grid[0]) for y in range(grid[1]) for z in range(grid[2])]
        perm = random.Random(len(ids)).sample(ids, len(ids))
        order.clear()
        order.update(zip(ids, perm, strict=True))

    monkeypatch.setattr(builder, "set_grid_dim", shuffled_dim)
    monkeypatch.setattr(builder, "set_grid_idx", lambda x, y, z: set_idx(*order[(x, y, z)]))


@pytest.mark.parametrize(("block_n", "splits", "stages"), [(32, 1, 0), (32, 1, 2), (64, 1, 0), (16, 2, 0), (32, 4, 2),
                                                       (64, 8, 0)])  # fmt: skip
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "window"), [(4, 2, 64, None), (4, 1, 256, 9)])
@pytest.mark.parametrize("merge", ["kernel", "inline"])
@pytest.mark.usefixtures("programs_out_of_order")
def test_decode_launch_configurations_agree(
    block_n: int, splits: int, stages: int, heads: int, kv_heads: int, dim: int, window: int | None, merge: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """One split writes the output itself; more go through the merge kernel or the inline
    merge (the last program of a token's KV head): all, at any block size and with two
    pipeline stages or the kernel's own choice (on a GPU; the interpreter has no pipeline),
    equal the reference (splits that get no keys included: 8 splits of 20 keys), and the
    inline merge leaves its arrival counters at zero for the next launch (run twice)."""
    from aserve.attention import triton_paged

    monkeypatch.setattr(triton_paged, "DECODE_MERGE", merge)
    monkeypatch.setattr(triton_paged, "_ARRIVALS", {})  # not another test's counters
    prefix = [0, 19, 60, 101]
    _, ref, (kc, vc, meta, q) = _case(3, heads, kv_heads, dim, prefix, [1] * 4, window)
    for _ in range(2):
        out = _decode(q, kc, vc, meta.req_to_token, meta.req_pool_indices, meta.seq_lens, 128, dim**-0.5, window,
                      torch.full_like(q, float("nan")), DecodeLaunch(block_n=block_n, num_stages=stages, splits=splits))  # fmt: skip
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    counters = list(triton_paged._ARRIVALS.values())
    assert len(counters) == (merge == "inline" and splits > 1)
    assert all(c.shape == (4 * kv_heads,) and (c == 0).all() for c in counters)


def test_decode_stages_two_for_narrow_heads_on_large_grids() -> None:
    """The stage rule measured on an H100 host (docs/benchmarks.md, thirty-fourth session):
    two stages for heads of 64 or less from 2,048 programs (Llama 3.2 1B at 256 rows), three for
    fewer programs (64 rows) or wider heads (Gemma 3 270M's 256); a launch that names its stages
    keeps them."""
    from aserve.attention.triton_paged import decode_stages

    assert decode_stages(64, 256 * 8) == 2 and decode_stages(64, 512 * 8) == 2
    assert decode_stages(64, 64 * 8) == 3 and decode_stages(256, 256 * 2) == 3 and decode_stages(256, 4096) == 3
    assert DecodeLaunch().num_stages == 0  # the rule's, unless ASERVE_DECODE_LAUNCH names stages


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs and the GPU's own program order")
def test_inline_merge_at_scale_and_in_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inline merge on a large grid (64 tokens x 8 KV heads x 32 splits), launched 50 times
    eagerly and replayed 50 times in a CUDA graph: every output bit-identical to the first and
    as close to the merge kernel's as summation order allows, the counters back at zero. A
    graph captured before any counters exist for its size merges with the kernel (counters made
    inside a capture would live in the graph's pool)."""
    from aserve.attention import triton_paged

    monkeypatch.setattr(triton_paged, "_ARRIVALS", {})
    gen = torch.Generator(device="cuda").manual_seed(0)
    t, hkv, group, d, n = 64, 8, 4, 128, 2048
    kc = torch.randn(t * n + 1, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    vc = torch.randn(t * n + 1, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    table = torch.arange(t * n, device="cuda").view(t, n)
    rows = torch.arange(t, device="cuda")
    seq_lens = torch.randint(0, n + 1, (t,), device="cuda", generator=gen)
    seq_lens[0], seq_lens[1] = 0, n
    q = torch.randn(t, hkv * group, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    launch = DecodeLaunch(splits=32)

    def run() -> torch.Tensor:
        return _decode(q, kc, vc, table, rows, seq_lens, n, d**-0.5, None, torch.full_like(q, float("nan")), launch)

    monkeypatch.setattr(triton_paged, "DECODE_MERGE", "kernel")
    ref = run()
    monkeypatch.setattr(triton_paged, "DECODE_MERGE", "inline")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # a capture before this size's counters exist: the merge kernel
        graph0 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph0):
            out0 = run()
    assert not triton_paged._ARRIVALS
    graph0.replay()
    torch.cuda.synchronize()
    assert torch.equal(out0, ref)
    first = run()
    torch.testing.assert_close(first, ref, rtol=1e-2, atol=1e-2)
    assert all(torch.equal(run(), first) for _ in range(50))
    with torch.cuda.stream(side):
        run()  # this stream's counters, made outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
    torch.cuda.synchronize()
    for _ in range(50):
        out.fill_(float("nan"))
        graph.replay()
        assert torch.equal(out, first)
    torch.cuda.synchronize()
    assert len(triton_paged._ARRIVALS) == 2  # the default stream's and the side stream's
    assert all((c == 0).all() for c in triton_paged._ARRIVALS.values())


@pytest.mark.parametrize(
    ("prefix", "extend"),
    [([0, 20, 33, 7], [37, 18, 1, 1]), ([33, 7, 0, 20], [1, 1, 37, 18]), ([33, 7, 60], [1, 1, 1])],
    # Decodes last, decodes first (the planner's order for a mixed step), decodes only.
    ids=["decodes-last", "decodes-first", "decodes-only"],
)
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "window"), [(4, 2, 32, None), (2, 1, 64, 6), (4, 1, 256, 6)])
def test_extend_mixed_batch_matches_reference(
    heads: int, kv_heads: int, dim: int, window: int | None, prefix: list[int], extend: list[int]
) -> None:
    out, ref, _ = _case(2, heads, kv_heads, dim, prefix, extend, window)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("prefix", "extend"),
    [([33, 7, 0, 20, 9], [1, 1, 37, 1, 18]), ([5, 60], [1, 1]), ([0, 4], [21, 6])],
    # The planner's mixed step with a one-token chunk after a longer one (not a leading decode),
    # decodes only, chunks only.
    ids=["mixed", "decodes-only", "chunks-only"],
)
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "window"), [(4, 2, 32, None), (4, 1, 256, 6)])
def test_fixed_shape_step_matches_reference(
    heads: int, kv_heads: int, dim: int, window: int | None, prefix: list[int], extend: list[int]
) -> None:
    """A CUDA graph's fixed-shape step (``token_bound``): tokens and sequences padded, no host
    lengths, the leading decodes through the decode kernel; the real rows match the reference
    and the padding rows are zeros."""
    out_ref, ref, (kc, vc, meta, q_real) = _case(4, heads, kv_heads, dim, prefix, extend, window)
    t = sum(extend)
    pt, pb = 7, 3  # padding tokens and sequences
    spare_row, pad_slot = 7, kc.shape[0] - 1

    def pad(x: torch.Tensor, n: int, value: int) -> torch.Tensor:
        return torch.cat([x, torch.full((n,), value, dtype=x.dtype, device=x.device)])

    fixed = AttentionMetadata(
        positions=pad(meta.positions, pt, 0), out_cache_loc=pad(meta.out_cache_loc, pt, pad_slot),
        req_pool_indices=pad(meta.req_pool_indices, pb, spare_row), prefix_lens=pad(meta.prefix_lens, pb, 0),
        extend_lens=pad(meta.extend_lens, pb, 0), seq_lens=pad(meta.seq_lens, pb, 0), req_to_token=meta.req_to_token,
        logits_indices=pad(meta.logits_indices, pb, 0), prefix_lens_cpu=[], extend_lens_cpu=[],
        backend="triton", seq_len_bound=meta.req_to_token.shape[1], token_bound=t + pt,
    )  # fmt: skip
    g = torch.Generator().manual_seed(5)
    q = torch.cat([q_real, torch.randn(pt, heads, dim, generator=g).to(DEVICE)])
    out = attend_triton(q, kc, vc, fixed, dim**-0.5, window)  # the cache already holds the new K/V
    torch.testing.assert_close(out[:t], ref, rtol=1e-4, atol=1e-4)
    assert (out[t:] == 0).all()
    torch.testing.assert_close(out[:t], out_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("prefix", "extend"), [([0, 5, 40, 77], [1, 1, 1, 1]), ([33, 7, 0], [1, 1, 37])],
                         ids=["decode", "mixed"])  # fmt: skip
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "window"), [(8, 4, 32, None), (4, 2, 64, 6)])
def test_head_major_cache_gives_the_same_outputs(
    heads: int, kv_heads: int, dim: int, window: int | None, prefix: list[int], extend: list[int]
) -> None:
    """The kernels index the cache through its strides: a head-major cache
    (``kv_tensor(..., "head")``) holding the same keys gives bit-identical outputs and receives
    the new tokens' K/V at the same [slot, head] places."""
    from aserve.kv.pool import kv_tensor
    from aserve.models.config import ModelConfig

    _, _, (kc, vc, meta, q) = _case(6, heads, kv_heads, dim, prefix, extend, window)
    cfg = ModelConfig(
        architecture="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=dim, rms_norm_eps=1e-6, max_position_embeddings=128, rope_theta=1e4,
    )  # fmt: skip
    g = torch.Generator().manual_seed(6)
    t = sum(extend)
    k, v = (torch.randn(t, kv_heads, dim, generator=g).to(DEVICE) for _ in range(2))
    caches = []
    for layout in ("token", "head"):
        kc2, vc2 = (kv_tensor(kc.shape[0], cfg, kc.dtype, kc.device, layout) for _ in range(2))
        kc2.copy_(kc)
        vc2.copy_(vc)
        assert kc2.is_contiguous() == (layout == "token")
        fresh = build_metadata(meta.req_to_token, meta.req_pool_indices.tolist(), meta.prefix_lens.tolist(),
                               extend, DEVICE)  # fmt: skip
        caches.append((paged_attention_triton(q, k, v, kc2, vc2, fresh, dim**-0.5, window), kc2, vc2))
    (out_t, kc_t, vc_t), (out_h, kc_h, vc_h) = caches
    assert torch.equal(out_h, out_t) and torch.isfinite(out_h).all()
    assert torch.equal(kc_h, kc_t) and torch.equal(vc_h, vc_t)


@pytest.mark.parametrize("extend", [[20, 13], [1, 1, 1], [1, 1, 20]], ids=["extend", "decode", "mixed"])
def test_poisoned_output_is_fully_written(monkeypatch: pytest.MonkeyPatch, extend: list[int]) -> None:
    """Both kernels write every element: their output (and split) buffers start as NaN here."""
    import aserve.attention.triton_paged as tp

    real_empty = torch.empty

    def poisoned_like(x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, float("nan"))

    def poisoned(*shape: int, **kw: object) -> torch.Tensor:
        return real_empty(*shape, **kw).fill_(float("nan"))  # type: ignore[arg-type]

    monkeypatch.setattr(tp.torch, "empty_like", poisoned_like)
    monkeypatch.setattr(tp.torch, "empty", poisoned)
    out, ref, _ = _case(3, 4, 2, 32, [3, 0, 60][: len(extend)], extend, None)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="long random cases need the GPU")
@pytest.mark.parametrize("seed", range(8))
def test_random_long_cases_bfloat16(seed: int) -> None:
    """Random batch, lengths up to 4k keys, head shapes of the target models, bf16 vs the
    reference run in float32 on the same bf16 values; decode batches and mixed extends."""
    rng = random.Random(seed)
    heads, kv_heads, dim, window = rng.choice([(4, 1, 256, 512), (4, 1, 256, None), (32, 8, 64, None),
                                               (16, 2, 128, None), (8, 8, 64, 100)])  # fmt: skip
    batch = rng.randint(1, 96)
    decode = seed % 2 == 0
    prefix = [rng.randint(0, 4000) for _ in range(batch)]
    extend = [1] * batch if decode else [rng.randint(1, 300) for _ in range(batch)]
    if not decode and seed % 4 == 1:  # the planner's mixed step: decodes first, then chunks
        extend = [1] * (batch // 2) + extend[batch // 2 :]
    if not decode:
        prefix = [p % 1500 for p in prefix]
    cols = max(p + e for p, e in zip(prefix, extend))
    g = torch.Generator().manual_seed(seed)
    slots_total = batch * cols
    table = torch.randperm(slots_total, generator=g).view(batch, cols).to(DEVICE)
    rows = list(range(batch))
    t = sum(extend)
    bf = torch.bfloat16
    q, k, v = (torch.randn(t, n, dim, generator=g).to(DEVICE, bf) for n in (heads, kv_heads, kv_heads))
    kc = torch.randn(slots_total + 1, kv_heads, dim, generator=g).to(DEVICE, bf)
    vc = torch.randn(slots_total + 1, kv_heads, dim, generator=g).to(DEVICE, bf)
    ref = paged_attention(q.float(), k.float(), v.float(), kc.float(), vc.float(),
                          build_metadata(table, rows, prefix, extend, DEVICE), dim**-0.5, window)  # fmt: skip
    out = paged_attention_triton(
        q, k, v, kc, vc, build_metadata(table, rows, prefix, extend, DEVICE), dim**-0.5, window
    )
    assert out.dtype == bf and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)

"""A decoder stack's step in one C call (``cpu_ops.decoder_stack``) against the same step
through the Python modules, on the bundled model's GGUF blocks: the same bits.

Both paths run the same C kernels in the same order, so logits and the KV cache must match
exactly; the Python path's kernels are themselves checked against gguf-py and transformers
elsewhere (test_gguf_linear.py, tests/models/test_gguf_default.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from aserve.kernels import cpu_ops
from aserve.kernels import gguf_linear as gl
from aserve.models.config import ModelConfig
from aserve.models.layers import _STACK_PLANS, set_fused_ops
from aserve.models.loader import load_model
from tests.models.paged import PagedRunner

pytestmark = pytest.mark.skipif(gl.kernel() is None, reason=f"GGUF CPU kernel not built: {gl.unavailable_reason()}")


@pytest.fixture(scope="module")
def model() -> tuple[ModelConfig, nn.Module]:
    cfg, m, _ = load_model("gemma-3-270m", torch.float32, torch.device("cpu"), gguf_blocks=True)
    set_fused_ops(m, True)
    for mod in m.modules():
        if isinstance(mod, gl.GGUFLinear) and mod is not m.model.embed_tokens.head:
            mod.gemm_bf16 = True  # the CPU default where AVX-512 BF16 exists: 7+ rows take the bf16 tiles
    return cfg, m


def test_fused_ops_switch_the_rotary_tables(model: tuple[ModelConfig, nn.Module]) -> None:
    """``set_fused_ops`` reaches the model's rotary tables (not modules): on a GPU they are
    one kernel; on a CPU ``cos_sin`` keeps torch's ops either way."""
    _, m = model
    ropes = [m.rope_local, m.rope_global]
    assert all(r.fused for r in ropes)
    set_fused_ops(m, False)
    try:
        assert not any(r.fused for r in ropes)
    finally:
        set_fused_ops(m, True)


class _Count:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        k = gl.kernel()
        self.calls = 0
        real = k.decoder_layers  # type: ignore[union-attr]

        def counted(*args: Any) -> None:
            self.calls += 1
            real(*args)

        monkeypatch.setattr(k, "decoder_layers", counted)


def _steps(runner: PagedRunner, stack: bool) -> list[torch.Tensor]:
    prev = cpu_ops.set_decoder_stack(stack)
    try:
        out = [runner.step([(0, list(range(2, 40))), (1, [2, 5, 9])])]  # 41 tokens: the Python path
        out.append(runner.step([(0, [7])]))  # one stream
        out.append(runner.step([(0, [8]), (1, [11, 12])]))  # a short extend beside a decode
        out.append(runner.step([(r, [20 + r]) for r in range(2)] + [(r, [3, 4, 5]) for r in range(2, 8)]))
        out.append(runner.step([(r, [30 + r]) for r in range(8)]))  # 8 rows: the bfloat16 tiles
        return out
    finally:
        cpu_ops.set_decoder_stack(prev)


def _set_bf16(m: nn.Module, on: bool) -> None:
    for mod in m.model.layers.modules():
        if isinstance(mod, gl.GGUFLinear):
            mod.gemm_bf16 = on


def test_one_call_stack_equals_the_modules(
    model: tuple[ModelConfig, nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Float32 throughout (``gemm_bf16`` off): every step the same bits, logits and KV cache."""
    cfg, m = model
    count = _Count(monkeypatch)
    _set_bf16(m, False)
    try:
        ref_runner = PagedRunner(m, cfg, torch.float32, rows=8, max_ctx=64)
        ref = _steps(ref_runner, stack=False)
        assert count.calls == 0
        runner = PagedRunner(m, cfg, torch.float32, rows=8, max_ctx=64)
        got = _steps(runner, stack=True)
    finally:
        _set_bf16(m, True)
    assert count.calls == 4  # every step but the 41-token one
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert torch.equal(a, b), (i, (a - b).abs().max().item())
    for (k1, v1), (k2, v2) in zip(runner.kv, ref_runner.kv, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_decode_steps_of_7_or_more_streams_take_bfloat16(model: tuple[ModelConfig, nn.Module]) -> None:
    """With ``gemm_bf16`` (the CPU default where AVX-512 BF16 exists) the stack multiplies an
    all-decode step of 8 rows in bfloat16, where the modules stay float32: that step's logits
    differ, to bfloat16's rounding; every other step (one stream, mixed steps with extends, the
    prefill) keeps the same bits."""
    cfg, m = model
    if not gl.kernel().has_bf16():  # type: ignore[union-attr]
        pytest.skip("the CPU has no AVX-512 BF16")
    ref = _steps(PagedRunner(m, cfg, torch.float32, rows=8, max_ctx=64), stack=False)
    got = _steps(PagedRunner(m, cfg, torch.float32, rows=8, max_ctx=64), stack=True)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        if i != 4:
            assert torch.equal(a, b), (i, (a - b).abs().max().item())
    assert not torch.equal(got[4], ref[4])
    assert (got[4] - ref[4]).abs().max() < 0.05 * ref[4].abs().max()
    assert (got[4].argmax(-1) == ref[4].argmax(-1)).float().mean() >= 0.75


def test_plan_follows_the_projections_flags(model: tuple[ModelConfig, nn.Module]) -> None:
    """A plan holds each projection's bf16 flag: changing one rebuilds it."""
    cfg, m = model
    layers = m.model.layers
    runner = PagedRunner(m, cfg, torch.float32, rows=8, max_ctx=16)
    runner.step([(r, [2, 3]) for r in range(8)])
    first = _STACK_PLANS[layers][1]
    assert first is not None
    proj = layers[0].self_attn.q_proj
    proj.gemm_bf16 = False
    try:
        runner.step([(r, [4]) for r in range(8)])
        assert _STACK_PLANS[layers][1] is not first
    finally:
        proj.gemm_bf16 = True


def test_gated_matches_float64() -> None:
    """The C GELU (tanh) / SiLU against float64 torch: relative 1e-5 where the value is not
    vanishing (torch's float32 GELU itself is off by 100% for gate < -3, where tanh ~ -1)."""
    import torch.nn.functional as F

    g = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 4
    u = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    for act, fn in (("gelu_tanh", lambda v: F.gelu(v, approximate="tanh")), ("silu", F.silu)):
        got = cpu_ops.gated(g, u, act).double()
        want = fn(g.double()) * u.double()
        assert ((got - want).abs() <= 1e-5 * want.abs() + 1e-30 + 1e-6 * (g < -6).double()).all(), act

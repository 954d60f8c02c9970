"""``gguf_head="int8"``: the default model's LM head with 8-bit activations, through the
engine (the kernel itself: tests/kernels/test_q8_0_int8.py)."""

from __future__ import annotations

import pytest

import aserve
from aserve.errors import InvalidRequestError
from aserve.kernels import gguf_linear

pytestmark = pytest.mark.skipif(gguf_linear.kernel() is None, reason="GGUF CPU kernel not built")

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    return", "Once upon a time"]


async def _greedy(**kwargs: object) -> tuple[str, list[list[int]]]:
    params = aserve.SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    async with aserve.Engine(model="gemma-3-270m", warmup=False, **kwargs) as engine:  # type: ignore[arg-type]
        batch = await engine.complete_many(PROMPTS, params)
        return engine.info()["weights"], [o.token_ids for o in sorted(batch.outputs, key=lambda o: o.index)]


async def test_int8_head_runs_and_overlap_equals_serial() -> None:
    weights, overlap = await _greedy(gguf_head="int8")
    assert "LM head int8" in weights
    _, serial = await _greedy(gguf_head="int8", overlap=False)
    assert overlap == serial


async def test_int8_head_needs_gguf_blocks() -> None:
    with pytest.raises(InvalidRequestError, match="gguf_head"):
        async with aserve.Engine(model="gemma-3-270m", dtype="float32", gguf_head="int8", warmup=False):
            pass
    with pytest.raises(InvalidRequestError, match="gguf_head"):
        aserve.EngineConfig(gguf_head="int4")  # type: ignore[arg-type]


async def test_the_default_head_takes_int8_where_the_cpu_has_vnni() -> None:
    kernel = gguf_linear.kernel()
    assert kernel is not None
    async with aserve.Engine(model="gemma-3-270m", warmup=False) as engine:
        assert ("LM head int8 (vnni)" in engine.info()["weights"]) == (kernel.i8_isa() == "vnni")
    async with aserve.Engine(model="gemma-3-270m", gguf_head="float32", warmup=False) as engine:
        assert "LM head int8" not in engine.info()["weights"]

"""The decode graph's argmax runs over the LM head's own output (bf16 on a GPU) instead of a
float32 copy: the same tokens, and the float32 logits still where a step samples."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from aserve.models.loader import load_model
from tests.tiny import make_tiny_model


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_head_dtype_logits_argmax_equals_float32(tmp_path: Path, kind: str) -> None:
    path, _ = make_tiny_model(kind, tmp_path)
    _, model, _ = load_model(str(path), torch.bfloat16, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    # Many rows and a coarse scale: bf16 rounds many logits to equal values, so ties occur
    # and the argmax's first-index rule is exercised too.
    h = (torch.randn(512, model.config.hidden_size, generator=g) * 0.05).to(torch.bfloat16)
    with torch.inference_mode():
        native = model.logits(h, head_dtype=True)
        full = model.logits(h)
    assert native.dtype == torch.bfloat16 and full.dtype == torch.float32
    assert torch.equal(native.float(), full)
    assert torch.equal(native.argmax(dim=-1), full.argmax(dim=-1))


def test_soft_capped_logits_stay_float32(tmp_path: Path) -> None:
    path, _ = make_tiny_model("llama", tmp_path)
    _, model, _ = load_model(str(path), torch.bfloat16, torch.device("cpu"))
    model.config = dataclasses.replace(model.config, final_logit_softcapping=30.0)  # applied in float32
    h = torch.randn(4, model.config.hidden_size).to(torch.bfloat16)
    with torch.inference_mode():
        out = model.logits(h, head_dtype=True)
    assert out.dtype == torch.float32
    assert out.abs().max() <= 30.0

"""The bundled Gemma 3 270M Q4_K_M GGUF vs transformers' own GGUF loader, plus bad inputs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from aserve.errors import ModelLoadError, ModelNotFoundError
from aserve.models.config import ModelConfig
from aserve.models.loader import load_model, resolve_model_path
from tests.models.paged import PagedRunner

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    return"]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return resolve_model_path("gemma-3-270m")


@pytest.fixture(scope="module")
def ours(gguf_path: Path) -> tuple[ModelConfig, nn.Module]:
    start = time.perf_counter()
    cfg, model, path = load_model("gemma-3-270m", torch.float32, torch.device("cpu"))
    print(f"\naserve load of {path.name}: {time.perf_counter() - start:.2f} s")
    return cfg, model


@pytest.fixture(scope="module")
def reference(gguf_path: Path) -> tuple[Any, Any]:
    # transformers' from_pretrained(gguf_file=...) needs accelerate (not installed); its GGUF
    # parser + tensor mapping (what from_pretrained uses) is called directly instead.
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    hf = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=hf)
    missing, _ = hf.load_state_dict(parsed["tensors"], strict=False)
    hf.tie_weights()
    assert set(missing) <= {"lm_head.weight"}, missing
    hf.eval()
    return tok, hf


@pytest.fixture(scope="module")
def ours_blocks(gguf_path: Path) -> tuple[ModelConfig, nn.Module]:
    from aserve.kernels.gguf_linear import kernel, unavailable_reason

    if kernel() is None:
        pytest.skip(f"GGUF CPU kernel not built: {unavailable_reason()}")
    cfg, model, _ = load_model("gemma-3-270m", torch.float32, torch.device("cpu"), gguf_blocks=True)
    return cfg, model


@torch.no_grad()
def test_matches_transformers(ours: tuple[ModelConfig, nn.Module], reference: tuple[Any, Any]) -> None:
    _check_against_transformers(ours, reference)


@torch.no_grad()
def test_gguf_blocks_match_transformers(ours_blocks: tuple[ModelConfig, nn.Module], reference: tuple[Any, Any]) -> None:
    """The weights kept as GGUF blocks on aserve's kernel, against transformers' float32."""
    from aserve.kernels.gguf_linear import GGUFEmbedding, GGUFLinear

    _, model = ours_blocks
    kinds = {type(m) for m in model.modules()}
    assert GGUFLinear in kinds and GGUFEmbedding in kinds and nn.Linear not in kinds
    _check_against_transformers(ours_blocks, reference)


@torch.no_grad()
def test_gguf_blocks_with_the_c_small_ops_match_transformers(
    ours_blocks: tuple[ModelConfig, nn.Module], reference: tuple[Any, Any]
) -> None:
    """The CPU default: GGUF blocks plus the C norms, rotary and attention (kernels/cpu_ops.py)."""
    from aserve.models.layers import set_fused_ops

    _, model = ours_blocks
    set_fused_ops(model, True)
    try:
        _check_against_transformers(ours_blocks, reference)
    finally:
        set_fused_ops(model, False)


def _check_against_transformers(ours: tuple[ModelConfig, nn.Module], reference: tuple[Any, Any]) -> None:
    cfg, model = ours
    tok, hf = reference
    for prompt in PROMPTS:
        ids: list[int] = tok(prompt)["input_ids"]
        assert ids[0] == cfg.bos_token_id
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)  # [L, vocab]
        runner = PagedRunner(model, cfg, torch.float32, rows=1, max_ctx=64)
        # Prefill the first half, then decode token by token to get logits at every position.
        half = len(ids) // 2
        got = [runner.step([(0, ids[:half])])[0]]
        got += [runner.step([(0, [t])])[0] for t in ids[half:]]
        lp = torch.log_softmax(torch.stack(got), -1)  # [L - half + 1, vocab]
        want = ref[half - 1 :]
        assert torch.equal(lp.argmax(-1), want.argmax(-1)), prompt
        diff = (lp - want).abs().max().item()
        print(f"{prompt!r}: {len(ids)} tokens, max |dlogprob| = {diff:.2e}")
        assert diff < 1e-3, (prompt, diff)


def test_unknown_model_string() -> None:
    with pytest.raises(ModelNotFoundError, match="accepted"):
        resolve_model_path("no-such-model-xyz")


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        load_model(str(tmp_path), torch.float32, torch.device("cpu"))


def test_truncated_gguf(gguf_path: Path, tmp_path: Path) -> None:
    bad = tmp_path / "truncated.gguf"
    with gguf_path.open("rb") as f:
        bad.write_bytes(f.read(1 << 20))
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(str(bad), torch.float32, torch.device("cpu"))

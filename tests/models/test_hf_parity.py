"""Our models vs transformers on tiny random checkpoints, through the paged KV cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from aserve.models.config import ModelConfig
from aserve.models.loader import load_model
from tests.models.paged import PagedRunner

TOL = 1e-3
VOCAB = 128


def _gemma3() -> Any:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=24, final_logit_softcapping=5.0, max_position_embeddings=128,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
        },
    )  # fmt: skip
    return Gemma3ForCausalLM(cfg)


def _llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    )  # fmt: skip
    return LlamaForCausalLM(cfg)


def _qwen2() -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


FACTORIES: dict[str, Callable[[], Any]] = {"gemma3": _gemma3, "llama": _llama, "qwen2": _qwen2}


class Pair:
    def __init__(self, hf: Any, cfg: ModelConfig, ours: nn.Module, path: Path) -> None:
        self.hf, self.cfg, self.ours, self.path = hf, cfg, ours, path
        self._ref: dict[tuple[int, ...], torch.Tensor] = {}

    @torch.no_grad()
    def ref_logprobs(self, ids: list[int]) -> torch.Tensor:
        """transformers' log_softmax at every position of ``ids`` -> [L, vocab]."""
        key = tuple(ids)
        if key not in self._ref:
            logits = self.hf(torch.tensor([ids])).logits[0].float()
            self._ref[key] = torch.log_softmax(logits, -1)
        return self._ref[key]

    def runner(self) -> PagedRunner:
        return PagedRunner(self.ours, self.cfg, torch.float32)


@pytest.fixture(scope="module", params=sorted(FACTORIES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    torch.manual_seed(0)
    hf = FACTORIES[request.param]()
    # Random norms/biases too (defaults are 0 or 1 and would hide convention bugs).
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.eval()
    d: Path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(d, safe_serialization=True)
    cfg, ours, _ = load_model(str(d), torch.float32, torch.device("cpu"))
    hf.config._attn_implementation = "eager"
    return Pair(hf, cfg, ours, d)


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def _close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    diff = (torch.log_softmax(ours, -1) - ref).abs().max().item()
    assert diff < TOL, diff


def test_full_prefill(pair: Pair) -> None:
    ids = _prompt(13, 1)
    logits = pair.runner().step([(0, ids)])
    _close(logits[0], pair.ref_logprobs(ids)[-1])


def test_prefill_then_decode(pair: Pair) -> None:
    ids = _prompt(14, 2)
    r = pair.runner()
    ref = pair.ref_logprobs(ids)
    _close(r.step([(1, ids[:7])])[0], ref[6])
    for i in range(7, 14):
        _close(r.step([(1, [ids[i]])])[0], ref[i])


def test_mixed_batch(pair: Pair) -> None:
    a, b, c = _prompt(11, 3), _prompt(9, 4), _prompt(6, 5)
    r = pair.runner()
    r.step([(2, b[:6]), (0, c[:3])])
    # One sequence prefills its whole prompt while two others decode one token each.
    logits = r.step([(2, [b[6]]), (1, a), (0, [c[3]])])
    _close(logits[0], pair.ref_logprobs(b)[6])
    _close(logits[1], pair.ref_logprobs(a)[-1])
    _close(logits[2], pair.ref_logprobs(c)[3])
    logits = r.step([(0, c[4:6]), (1, [5]), (2, b[7:9])])
    _close(logits[0], pair.ref_logprobs(c)[5])
    _close(logits[1], pair.ref_logprobs([*a, 5])[-1])
    _close(logits[2], pair.ref_logprobs(b)[8])


def test_chunked_prefill(pair: Pair) -> None:
    ids = _prompt(17, 6)
    ref = pair.ref_logprobs(ids)
    r = pair.runner()
    end = 0
    for chunk in (5, 5, 1, 6):
        logits = r.step([(3, ids[end : end + chunk])])
        end += chunk
        _close(logits[0], ref[end - 1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_mixed_batch(pair: Pair, dtype: torch.dtype) -> None:
    dev = torch.device("cuda")
    cfg, model, _ = load_model(str(pair.path), dtype, dev)
    r = PagedRunner(model, cfg, dtype, device=dev)
    a, b = _prompt(11, 7), _prompt(8, 8)
    r.step([(0, b[:5])])
    logits = r.step([(1, a), (0, [b[5]])])
    tol = TOL if dtype == torch.float32 else 0.15
    for got, want in ((logits[0], pair.ref_logprobs(a)[-1]), (logits[1], pair.ref_logprobs(b)[5])):
        diff = (torch.log_softmax(got.float(), -1) - want).abs().max().item()
        assert diff < tol, diff


def test_gemma3_conditional_generation_text_part(tmp_path: Path) -> None:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    torch.manual_seed(2)
    text = _gemma3().config
    # transformers' multimodal head skips final softcapping (None in every real Gemma 3 config).
    text.final_logit_softcapping = None
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    hf = Gemma3ForConditionalGeneration(
        Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4)
    )
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    cfg, ours, _ = load_model(str(tmp_path), torch.float32, torch.device("cpu"))
    assert cfg.architecture == "gemma3" and cfg.layer_types == tuple(text.layer_types)
    pair = Pair(hf, cfg, ours, tmp_path)
    ids = _prompt(10, 11)
    _close(pair.runner().step([(0, ids)])[0], pair.ref_logprobs(ids)[-1])

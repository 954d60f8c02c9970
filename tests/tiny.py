"""Tiny random checkpoints saved by transformers, with a real sentencepiece tokenizer.

The engine loads them like any Hugging Face directory; transformers loads the same files
as the independent reference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch

TEXT = (
    "The quick brown fox jumps over the lazy dog. Serving engines batch requests together.\n"
    "Numbers 123 and 4567, punctuation: ;!? and quotes 'like' \"this\". Über café 日本語 🙂\n"
    "def f(x):\n    return x * 2\n"
) * 30


def _train_tokenizer(root: Path) -> int:
    (root / "train.txt").write_text(TEXT)
    spm.SentencePieceTrainer.train(
        input=str(root / "train.txt"),
        model_prefix=str(root / "tokenizer"),
        vocab_size=384,
        model_type="bpe",
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        minloglevel=2,
    )
    (root / "train.txt").unlink()
    (root / "tokenizer.vocab").unlink()
    cfg = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
           "add_bos_token": True}  # fmt: skip
    (root / "tokenizer_config.json").write_text(json.dumps(cfg))
    return 384


def _hf_model(kind: str, vocab: int) -> Any:
    common: dict[str, Any] = {"vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
                              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}  # fmt: skip
    if kind == "gemma3":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        cfg = Gemma3TextConfig(
            num_hidden_layers=3, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"], **common,
        )  # fmt: skip
        return Gemma3ForCausalLM(cfg)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            num_hidden_layers=2, tie_word_embeddings=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            **common,
        )  # fmt: skip
        return LlamaForCausalLM(cfg)
    raise ValueError(kind)


def make_tiny_model(kind: str, root: Path, seed: int = 0) -> tuple[Path, Any]:
    """Save a random ``kind`` model + tokenizer in ``root``; return (dir, the transformers model)."""
    root.mkdir(parents=True, exist_ok=True)
    vocab = _train_tokenizer(root)
    torch.manual_seed(seed)
    hf = _hf_model(kind, vocab)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            # Random norms too (defaults of 0/1 hide convention bugs); peaked logits keep
            # greedy decoding away from near-ties between float32 implementations.
            if "embed" in name or "lm_head" in name:
                # Gemma scales embeddings by sqrt(hidden) and ties the head: keep the input
                # token's own embedding from dominating the logits (it would repeat forever).
                p.normal_(0.0, 0.02 if kind == "gemma3" else 0.5)
            else:
                p.normal_(0.0, 0.3 if kind == "gemma3" else 0.15)
    hf.eval()
    hf.config._attn_implementation = "eager"
    hf.save_pretrained(root, safe_serialization=True)
    return root, hf


@torch.no_grad()
def hf_greedy(hf: Any, prompt: list[int], max_new: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation (no EOS stop) and the logprob of each chosen token."""
    ids = torch.tensor([prompt])
    out = hf.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=None, pad_token_id=0,
                      output_scores=True, output_logits=True, return_dict_in_generate=True)  # fmt: skip
    new = out.sequences[0, len(prompt) :].tolist()
    lps = [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(out.logits, new)]
    return new, lps

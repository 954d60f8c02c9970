"""Random-weight checkpoints in ``device_bench``'s model shapes, and its ``parity`` section.

``build_checkpoint`` saves transformers' seeded initialisation as safetensors beside the
tokenizer; ``check_parity`` compares the engine's float32 greedy tokens with transformers'.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import anyio
import torch

import aserve

SHAPES: dict[str, dict[str, Any]] = {
    "gemma3-270m": {
        "arch": "gemma3", "vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048,
        "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
        "sliding_window": 512, "max_position_embeddings": 32768, "query_pre_attn_scalar": 256,
    },
    "llama3.2-1b": {
        "arch": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "max_position_embeddings": 131072, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    },
    # Small stand-ins so the script itself can be exercised on a CPU.
    "tiny-gemma3": {
        "arch": "gemma3", "vocab_size": 262144, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "sliding_window": 16, "max_position_embeddings": 4096, "query_pre_attn_scalar": 32,
    },
    "tiny-llama": {
        "arch": "llama", "vocab_size": 128256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 4096, "tie_word_embeddings": True,
    },
}  # fmt: skip


def build_checkpoint(shape: str, root: Path, tokenizer_dir: Path, seed: int = 0) -> tuple[Path, Any]:
    """Random weights (transformers' init) saved as safetensors, plus the tokenizer files."""
    spec = dict(SHAPES[shape])
    arch = spec.pop("arch")
    torch.manual_seed(seed)
    model: Any
    if arch == "gemma3":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        n = spec["num_hidden_layers"]
        layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
        if "full_attention" not in layer_types:
            layer_types[-1] = "full_attention"
        gcfg = Gemma3TextConfig(**spec, layer_types=layer_types, bos_token_id=2, eos_token_id=1, pad_token_id=0)
        model = Gemma3ForCausalLM(gcfg)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        lcfg = LlamaConfig(**spec, bos_token_id=2, eos_token_id=1, pad_token_id=0)
        model = LlamaForCausalLM(lcfg)
    model.eval()
    path = root / shape
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    shutil.copy(tokenizer_dir / "tokenizer.model", path / "tokenizer.model")
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<bos>", "eos_token": "<eos>", "add_bos_token": True})
    )
    return path, model


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[2] + [rng.randrange(10, min(vocab, 200_000)) for _ in range(length - 1)] for _ in range(n)]


async def _run_batch(engine: aserve.Engine, prompts: list[list[int]], params: aserve.SamplingParams) -> list[Any]:
    out: list[Any] = [None] * len(prompts)

    async def one(i: int) -> None:
        out[i] = await engine.complete(prompts[i], params)

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return out


def check_parity(
    shape: str, root: Path, tok_dir: Path, device: str, max_new: int, opts: dict[str, Any]
) -> dict[str, Any]:
    path, hf = build_checkpoint(shape, root, tok_dir)
    hf = hf.to(device=device, dtype=torch.float32)
    hf.config._attn_implementation = "sdpa"
    prompts = _prompts(4, 12, hf.config.vocab_size, seed=1) + _prompts(2, 70, hf.config.vocab_size, seed=2)
    refs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            out = hf.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=None, pad_token_id=0)
            refs.append(out[0, len(p) :].tolist())
    del hf
    if device == "cuda":
        torch.cuda.empty_cache()
    params = aserve.SamplingParams(max_tokens=max_new, temperature=0, ignore_eos=True)

    async def run() -> list[Any]:
        async with aserve.Engine(model=str(path), device=device, dtype="float32", warmup=False,
                                 kv_cache_bytes=2**30, max_context=512, **opts) as engine:  # fmt: skip
            return await _run_batch(engine, prompts, params)

    res = anyio.run(run)
    matched = sum(r.token_ids == ref for r, ref in zip(res, refs))
    first_div = []
    for r, ref in zip(res, refs):
        k = next((i for i, (a, b) in enumerate(zip(r.token_ids, ref)) if a != b), None)
        first_div.append(k)
    return {"shape": shape, "requests": len(prompts), "exact_match": matched, "first_divergence": first_div}

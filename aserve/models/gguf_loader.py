"""Read a llama.cpp GGUF file: metadata -> ``ModelConfig``, tensors -> dequantized float32
(or, for the quantized CPU path, the weights' own blocks).

Names and conventions follow transformers' GGUF loader (our reference):
* Gemma norm weights are stored with ``+1`` folded in by the converter; we subtract it back
  because our Gemma RMSNorm multiplies by ``(1 + w)`` like transformers.
* llama.cpp permutes Llama q/k rows for its interleaved rotary; we undo that so the
  NeoX ("rotate_half") rotary applies. Qwen2 is not permuted by the converter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from aserve.errors import ModelLoadError
from aserve.models.config import ModelConfig, RopeScaling
from aserve.progress import Progress

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _open(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as e:  # the reader raises ValueError/IndexError/struct errors on bad bytes
        raise ModelLoadError(f"{path} is not a readable GGUF file (truncated or corrupt?): {e}") from e


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _llama3_from_rope_freqs(factors: np.ndarray, head_dim: int, base: float) -> RopeScaling:
    """llama.cpp stores Llama 3 scaling as per-frequency divisors; recover the parameters
    (factor = largest divisor, the published low/high factors and original context)."""
    from aserve.models.layers import rope_inv_freq

    cand = RopeScaling("llama3", float(factors.max()), 1.0, 4.0, 8192)
    plain = rope_inv_freq(head_dim, base, None)
    ours = plain / rope_inv_freq(head_dim, base, cand)
    if not np.allclose(ours.numpy(), factors, rtol=1e-3):
        raise ModelLoadError("rope_freqs tensor does not match Llama 3 scaling with low=1, high=4, ctx=8192")
    return cand


def _gemma3_layer_types(pattern: Any, layers: int) -> tuple[str, ...]:
    """An int ``n`` means every n-th layer is full attention (transformers' default is 6, used
    when the key is absent); a bool list marks each sliding-window layer (llama.cpp's SWA flags)."""
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ModelLoadError(f"sliding_window_pattern has {len(pattern)} entries for {layers} layers")
        return tuple("sliding_attention" if p else "full_attention" for p in pattern)
    n = 6 if pattern is None else int(pattern)
    return tuple("sliding_attention" if (i + 1) % n else "full_attention" for i in range(layers))


def config_from_gguf(reader: Any) -> ModelConfig:
    arch = str(_field(reader, "general.architecture", ""))
    if arch not in ("gemma3", "llama", "qwen2"):
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: gemma3, llama, qwen2")
    tensors = {t.name: t for t in reader.tensors}

    def req(key: str) -> Any:
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return v

    heads = int(req("attention.head_count"))
    hidden = int(req("embedding_length"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", 0) or hidden // heads)
    layers = int(req("block_count"))
    base = float(_field(reader, f"{arch}.rope.freq_base", 10000.0))
    scaling: RopeScaling | None = None
    if _field(reader, f"{arch}.rope.scaling.type") == "linear":
        scaling = RopeScaling("linear", float(req("rope.scaling.factor")))
    if "rope_freqs.weight" in tensors:
        scaling = _llama3_from_rope_freqs(np.asarray(tensors["rope_freqs.weight"].data), head_dim, base)
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    common: dict[str, Any] = dict(
        vocab_size=int(tensors["token_embd.weight"].shape[-1]),
        hidden_size=hidden,
        intermediate_size=int(req("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(req("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 8192)),
        rope_theta=base,
        rope_scaling=scaling,
        tie_word_embeddings="output.weight" not in tensors,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )
    if arch == "gemma3":
        layer_types = _gemma3_layer_types(_field(reader, "gemma3.attention.sliding_window_pattern"), layers)
        window = _field(reader, "gemma3.attention.sliding_window")
        return ModelConfig(
            architecture="gemma3",
            hidden_act="gelu_tanh",
            rope_local_base_freq=10000.0,
            sliding_window=None if window is None else int(window),
            layer_types=layer_types,
            # llama.cpp and transformers both scale by head_dim**-0.5 (256 for every size but 27B).
            query_pre_attn_scalar=float(head_dim),
            final_logit_softcapping=_field(reader, "gemma3.final_logit_softcapping"),
            **common,
        )
    return ModelConfig(architecture="llama", attention_bias="blk.0.attn_q.bias" in tensors, **common)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # w: [n_head * head_dim, ...] with each head's rows interleaved (pairs) by llama.cpp.
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def map_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4:
        mod = "pre_feedforward_layernorm" if parts[2] == "ffn_norm" else _LAYER_NAMES.get(parts[2])
        return None if mod is None else f"model.layers.{parts[1]}.{mod}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    return None


def read_gguf_tensors(
    path: Path, progress: Progress | None = None, keep_blocks: frozenset[int] = frozenset()
) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, int]]:
    """Map every tensor to our module names, dequantized to float32, except the 2-D weights
    whose GGML type is in ``keep_blocks``: those stay llama.cpp's blocks, ``[rows, row_bytes]``
    uint8, and their type is in the returned ``{name: ggml type}``."""
    from gguf.quants import dequantize

    reader = _open(path)
    cfg = config_from_gguf(reader)
    arch = str(_field(reader, "general.architecture"))
    out: dict[str, torch.Tensor] = {}
    qtypes: dict[str, int] = {}
    total = len(reader.tensors)
    for i, t in enumerate(reader.tensors):
        name = map_name(t.name)
        if name is not None:
            keep = int(t.tensor_type) in keep_blocks and len(t.shape) == 2
            try:
                w = np.array(t.data) if keep else np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            except Exception as e:
                raise ModelLoadError(f"{path}: cannot read tensor {t.name} (truncated?): {e}") from e
            # Row permutations apply to block rows as to float rows: a row is whole blocks.
            if arch == "llama" and t.name.split(".")[-2] == "attn_q":
                w = _unpermute(w, cfg.num_heads)
            elif arch == "llama" and t.name.split(".")[-2] == "attn_k":
                w = _unpermute(w, cfg.num_kv_heads)
            if cfg.architecture == "gemma3" and t.name.endswith("norm.weight"):
                w = w - 1.0
            # llama.cpp's ffn_norm is the post-attention norm in Llama's naming.
            if arch != "gemma3" and ".ffn_norm." in t.name:
                name = name.replace("pre_feedforward_layernorm", "post_attention_layernorm")
            if not w.flags.writeable or not w.flags.c_contiguous:
                w = np.array(w, order="C")  # F32 tensors come back as read-only views of the mmap
            out[name] = torch.from_numpy(w)
            if keep:
                qtypes[name] = int(t.tensor_type)
        if progress is not None:
            progress(i + 1, total)
    return cfg, out, qtypes

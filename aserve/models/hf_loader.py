"""Load a Hugging Face checkpoint directory: ``config.json`` + ``*.safetensors`` shards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from aserve.errors import ModelLoadError, ModelNotFoundError
from aserve.models.config import ModelConfig, RopeScaling
from aserve.progress import Progress

SUPPORTED_ARCHITECTURES = (
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
)


def _rope_params(d: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    """Rope settings from either transformers >= 5 ``rope_parameters`` or the older keys."""
    params = d.get("rope_parameters")
    if isinstance(params, dict):
        if layer_type is not None and isinstance(params.get(layer_type), dict):
            return dict(params[layer_type])
        if "rope_theta" in params or "rope_type" in params:
            return dict(params)
    out: dict[str, Any] = dict(d.get("rope_scaling") or {})
    if layer_type == "sliding_attention":
        return {"rope_type": "default", "rope_theta": d.get("rope_local_base_freq", 10000.0)}
    out.setdefault("rope_theta", d.get("rope_theta", 10000.0))
    return out


def _scaling(p: dict[str, Any]) -> RopeScaling | None:
    kind = p.get("rope_type", p.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind == "linear":
        return RopeScaling("linear", float(p["factor"]))
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            float(p["factor"]),
            float(p.get("low_freq_factor", 1.0)),
            float(p.get("high_freq_factor", 4.0)),
            int(p.get("original_max_position_embeddings", 8192)),
        )
    raise ModelLoadError(f"unsupported rope scaling type {kind!r} (supported: linear, llama3)")


def config_from_hf_dict(raw: dict[str, Any]) -> ModelConfig:
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(f"unsupported architectures {archs!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    d = raw.get("text_config", raw) if arch == "Gemma3ForConditionalGeneration" else raw
    heads = int(d["num_attention_heads"])
    hidden = int(d["hidden_size"])
    head_dim = int(d.get("head_dim") or hidden // heads)
    layers = int(d["num_hidden_layers"])
    eos = raw.get("eos_token_id", d.get("eos_token_id"))
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    common: dict[str, Any] = dict(
        vocab_size=int(d["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(d["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=eos_ids,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", d.get("tie_word_embeddings", True))),
    )
    if arch.startswith("Gemma3"):
        full = _rope_params(d, "full_attention")
        local = _rope_params(d, "sliding_attention")
        pattern = int(d.get("sliding_window_pattern", d.get("_sliding_window_pattern", 6)))
        layer_types = d.get("layer_types") or [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
        return ModelConfig(
            architecture="gemma3",
            rope_theta=float(full.get("rope_theta", 1_000_000.0)),
            rope_scaling=_scaling(full),
            rope_local_base_freq=float(local.get("rope_theta", 10_000.0)),
            hidden_act="gelu_tanh",
            attention_bias=bool(d.get("attention_bias", False)),
            sliding_window=d.get("sliding_window"),
            layer_types=tuple(layer_types),
            query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)),
            final_logit_softcapping=d.get("final_logit_softcapping"),
            attn_logit_softcapping=d.get("attn_logit_softcapping"),
            **common,
        )
    rope = _rope_params(d, None)
    window = d.get("sliding_window")
    types: tuple[str, ...] = ()
    if arch == "MistralForCausalLM" and window is not None:
        types = ("sliding_attention",) * layers
    elif arch == "Qwen2ForCausalLM" and d.get("use_sliding_window") and window is not None:
        types = tuple(d.get("layer_types") or ())
    act = str(d.get("hidden_act", "silu"))
    if act not in ("silu", "swish"):
        raise ModelLoadError(f"unsupported hidden_act {act!r} for {arch}")
    return ModelConfig(
        architecture="llama",
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        rope_scaling=_scaling(rope),
        attention_bias=arch == "Qwen2ForCausalLM" or bool(d.get("attention_bias", False)),
        sliding_window=window if types else None,
        layer_types=types,
        **common,
    )


def load_hf_config(path: Path) -> ModelConfig:
    cfg = path / "config.json"
    if not cfg.is_file():
        raise ModelNotFoundError(f"{path} has no config.json; expected a Hugging Face model directory")
    try:
        raw = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {cfg}: {e}") from e
    try:
        return config_from_hf_dict(raw)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{cfg} is missing or has a bad field: {e!r}") from e


def _normalise_name(name: str) -> str | None:
    """Map a checkpoint tensor name onto our module names; None for tensors we do not use."""
    for prefix in ("model.language_model.", "language_model.model."):
        if name.startswith(prefix):
            return "model." + name[len(prefix) :]
    if name.startswith("language_model.lm_head."):
        return name[len("language_model.") :]
    if name.startswith(("vision_tower.", "model.vision_tower.", "multi_modal_projector.")):
        return None
    if name.startswith("model.multi_modal_projector."):
        return None
    return name


def iter_hf_tensors(path: Path, progress: Progress | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors files")
    for i, f in enumerate(files):
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open is not iterable)
                    mapped = _normalise_name(name)
                    if mapped is not None:
                        yield mapped, st.get_tensor(name)
        except Exception as e:  # safetensors raises its own SafetensorError type
            raise ModelLoadError(f"cannot read safetensors file {f}: {e}") from e
        if progress is not None:
            progress(i + 1, len(files))

"""Model configuration shared by every architecture.

One frozen dataclass describes a decoder-only transformer well enough for both
Gemma 3 and the Llama family; loaders (GGUF metadata or HF ``config.json``) fill it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Architecture = Literal["gemma3", "llama"]


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 style frequency scaling (``rope_type == "llama3"``); ``linear`` divides positions."""

    rope_type: Literal["llama3", "linear"]
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: Architecture
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # Qwen2-style bias on q/k/v projections
    rope_scaling: RopeScaling | None = None
    hidden_act: Literal["silu", "gelu_tanh"] = "silu"
    # Gemma 3 only
    rope_local_base_freq: float = 10000.0
    sliding_window: int | None = None
    # layer_types[i] == "sliding_attention" | "full_attention"; empty means all full.
    layer_types: tuple[str, ...] = field(default_factory=tuple)
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attn_scale(self) -> float:
        if self.query_pre_attn_scalar is not None:
            return float(self.query_pre_attn_scalar) ** -0.5
        return float(self.head_dim) ** -0.5

    def layer_sliding_window(self, layer: int) -> int | None:
        """Window size for ``layer`` (keys with ``pos_q - pos_k >= window`` are masked), or None."""
        if self.sliding_window is None or not self.layer_types:
            return None
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

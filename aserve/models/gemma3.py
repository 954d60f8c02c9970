"""Gemma 3 text decoder (also the text part of Gemma3ForConditionalGeneration)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from aserve.models.causal_lm import CausalLM, CosSin, DecoderLayer
from aserve.models.config import ModelConfig
from aserve.models.layers import RMSNorm, Rotary


class Gemma3DecoderLayer(DecoderLayer):
    """Gemma's block: per-head q/k norms, GELU (tanh), ``1 + w`` norms, and sandwich norms
    (each sub-block's output is normalised before the residual add)."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__(config, layer, act="gelu_tanh", qk_norm=True, gemma_norms=True)
        eps = config.rms_norm_eps
        self.sliding = config.layer_sliding_window(layer) is not None
        self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, eps, gemma=True)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps, gemma=True)

    def norms(self) -> tuple[RMSNorm | None, RMSNorm, RMSNorm | None]:
        return self.post_attention_layernorm, self.pre_feedforward_layernorm, self.post_feedforward_layernorm


class Gemma3ForCausalLM(CausalLM):
    layer_cls = Gemma3DecoderLayer
    gemma_norms = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        # Sliding layers use the local base frequency and never rope scaling.
        self.rope_local = Rotary(config.head_dim, config.rope_local_base_freq, None)
        self.rope_global = Rotary(config.head_dim, config.rope_theta, config.rope_scaling)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = super().embed(input_ids)  # [T, hidden]
        # HF keeps the sqrt(hidden) normaliser as a float32 scalar cast to the weight dtype.
        return h * torch.tensor(self.config.hidden_size**0.5, dtype=torch.float32).to(h.dtype)

    def layer_rope(self, positions: torch.Tensor, dtype: torch.dtype) -> Callable[[nn.Module], CosSin]:
        local = self.rope_local.cos_sin(positions, dtype)
        glob = self.rope_global.cos_sin(positions, dtype)
        return lambda layer: local if layer.sliding else glob

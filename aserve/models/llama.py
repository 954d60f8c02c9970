"""Llama family decoder: Llama 2/3, Mistral, Qwen2 (q/k/v bias)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from aserve.models.causal_lm import CausalLM, CosSin, DecoderLayer
from aserve.models.config import ModelConfig
from aserve.models.layers import Rotary


class LlamaDecoderLayer(DecoderLayer):
    """Pre-norm residual blocks, Llama-style norms, no q/k norms."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__(config, layer, act=config.hidden_act, qk_norm=False, gemma_norms=False)


class LlamaForCausalLM(CausalLM):
    layer_cls = LlamaDecoderLayer

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.rope = Rotary(config.head_dim, config.rope_theta, config.rope_scaling)

    def layer_rope(self, positions: torch.Tensor, dtype: torch.dtype) -> Callable[[nn.Module], CosSin]:
        cos_sin = self.rope.cos_sin(positions, dtype)
        return lambda _layer: cos_sin

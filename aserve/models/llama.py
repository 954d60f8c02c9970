"""Llama family decoder: Llama 2/3, Mistral, Qwen2 (q/k/v bias)."""

from __future__ import annotations

import torch
from torch import nn

from aserve.attention.metadata import AttentionMetadata
from aserve.models.config import ModelConfig
from aserve.models.layers import GatedMLP, KVCache, PagedSelfAttention, RMSNorm, Rotary, add_norm, run_decoder_layers


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = PagedSelfAttention(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            bias=config.attention_bias,
            qk_norm_eps=None,
            scale=config.attn_scale,
            sliding_window=config.layer_sliding_window(layer),
            softcap=config.attn_logit_softcapping,
        )
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        h: torch.Tensor,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        kv: tuple[torch.Tensor, torch.Tensor],
        next_norm: RMSNorm,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # h: the residual stream [T, hidden]; x = input_layernorm(h); pre-norm residual
        # blocks. Returns (h', next_norm(h')): the next layer's input.
        h, x = add_norm(self.self_attn(x, cos_sin, meta, kv), h, self.post_attention_layernorm)
        return add_norm(self.mlp(x), h, next_norm)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope = Rotary(config.head_dim, config.rope_theta, config.rope_scaling)

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache) -> torch.Tensor:
        # input_ids: [T] -> logits [B, vocab] float32 at meta.logits_indices
        emb = self.model.embed_tokens
        h = emb(input_ids)  # [T, hidden]
        cos_sin = self.rope.cos_sin(meta.positions, h.dtype)
        x = run_decoder_layers(self.model.layers, self.model.norm, h, lambda _layer: cos_sin, meta, kv_cache)
        h = x[meta.logits_indices]  # [B, hidden], after the final norm
        weight = self.lm_head.weight if self.lm_head is not None else emb.weight
        logits = (h @ weight.t()).float()  # [B, vocab]
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

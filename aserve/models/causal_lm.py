"""The decoder-only causal LM skeleton the model families share.

``CausalLM`` holds the embedding, the decoder layers, the final norm and the LM head under
Hugging Face's parameter names (``model.embed_tokens``, ``model.layers.{i}``, ``model.norm``,
``lm_head``), so checkpoints map one to one; ``DecoderLayer`` is the residual block with
attention and a gated MLP. A family subclasses both and states only what differs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from aserve.attention.metadata import AttentionMetadata
from aserve.kernels.gguf_linear import GGUFEmbedding, GGUFLinear
from aserve.models.config import ModelConfig
from aserve.models.layers import GatedMLP, KVCache, PagedSelfAttention, RMSNorm, add_norm, run_decoder_layers

CosSin = tuple[torch.Tensor, torch.Tensor]


class DecoderLayer(nn.Module):
    """Pre-norm residual block: ``h += attn(x); x = mlp_norm(h); h += mlp(x)``; subclasses
    may also normalise each block's output before the residual add (see ``norms``)."""

    def __init__(self, config: ModelConfig, layer: int, *, act: str, qk_norm: bool, gemma_norms: bool) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = PagedSelfAttention(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            bias=config.attention_bias,
            qk_norm_eps=eps if qk_norm else None,
            scale=config.attn_scale,
            sliding_window=config.layer_sliding_window(layer),
            softcap=config.attn_logit_softcapping,
        )
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, act)
        self.input_layernorm = RMSNorm(config.hidden_size, eps, gemma=gemma_norms)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, gemma=gemma_norms)

    def norms(self) -> tuple[RMSNorm | None, RMSNorm, RMSNorm | None]:
        """(attention output norm, MLP input norm, MLP output norm); None: no norm there."""
        return None, self.post_attention_layernorm, None

    def forward(
        self,
        h: torch.Tensor,
        x: torch.Tensor,
        cos_sin: CosSin,
        meta: AttentionMetadata,
        kv: tuple[torch.Tensor, torch.Tensor],
        next_norm: RMSNorm,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # h: the residual stream [T, hidden]; x = input_layernorm(h).
        # Returns (h', next_norm(h')): the next layer's input.
        # The output and down projections may hand the fused add + norm split-K partial
        # products (layers.project), which only its fused kernel reads.
        attn_out_norm, mlp_in_norm, mlp_out_norm = self.norms()
        attn = self.self_attn(x, cos_sin, meta, kv, partial=mlp_in_norm.fused)
        h, x = add_norm(attn, h, mlp_in_norm, x_norm=attn_out_norm)
        return add_norm(self.mlp(x, partial=next_norm.fused), h, next_norm, x_norm=mlp_out_norm)


class DecoderModel(nn.Module):
    """The ``model.`` part of a checkpoint: embedding, decoder layers, final norm."""

    def __init__(
        self, config: ModelConfig, layer_cls: Callable[[ModelConfig, int], DecoderLayer], gemma_norms: bool
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layer_cls(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, gemma=gemma_norms)


class CausalLM(nn.Module):
    """Embedding -> decoder layers -> final norm -> logits at ``meta.logits_indices``.

    Subclasses set ``layer_cls`` (its constructor takes ``(config, layer)``) and
    ``gemma_norms`` (the final norm's form), and implement ``layer_rope``."""

    layer_cls: Callable[[ModelConfig, int], DecoderLayer]
    gemma_norms: bool = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, self.layer_cls, self.gemma_norms)
        self.lm_head: nn.Module | None = None  # nn.Linear, or GGUFLinear on GGUF blocks
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [T] -> [T, hidden], the decoder stack's input."""
        return self.model.embed_tokens(input_ids)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """h: [B, hidden] -> logits [B, vocab] (the LM head, or the tied embedding)."""
        embed = self.model.embed_tokens
        if self.lm_head is None and isinstance(embed, GGUFEmbedding):
            return embed.logits(h)
        if isinstance(self.lm_head, GGUFLinear):
            return self.lm_head(h)
        head = self.lm_head if self.lm_head is not None else embed
        assert isinstance(head, (nn.Linear, nn.Embedding)), type(head)
        return h @ head.weight.t()

    def layer_rope(self, positions: torch.Tensor, dtype: torch.dtype) -> Callable[[nn.Module], CosSin]:
        """The rotary (cos, sin) each decoder layer gets at ``positions`` [T]."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        out: torch.Tensor | None = None,
        *,
        head_dtype: bool = False,
        head: bool = True,
    ) -> torch.Tensor:
        # input_ids: [T] -> logits [B, vocab] float32 at meta.logits_indices (written into out if
        # given; in the head's own dtype with head_dtype, see logits()); with head=False the
        # final norm's output there, [B, hidden], for the caller's head (greedy(), candidates())
        h = self.hidden(input_ids, meta, kv_cache)[meta.logits_indices]
        return self.logits(h, out, head_dtype=head_dtype) if head else h

    def greedy(self, h: torch.Tensor) -> torch.Tensor:
        """h: [B, hidden] after the final norm -> ``logits(h).argmax(-1)`` [B] int64; on a CPU's
        int8 GGUF head without a soft-cap, from the kernel without writing the [B, vocab] logits
        (16 x 262k floats at 16 streams: a 16 MB write and read per step)."""
        head = self._kernel_head()
        tokens = head.argmax(h) if head is not None else None
        return tokens if tokens is not None else self.logits(h).argmax(dim=-1)

    def candidates(self, h: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """h: [B, hidden] after the final norm -> each row's ``t`` largest logits and their
        token ids ([B, t] each, in no order; the same values as ``logits(h)``), from the int8
        GGUF head's kernel without the [B, vocab] logits; None where the head cannot (the
        caller takes ``logits(h)``)."""
        head = self._kernel_head()
        return head.topk(h, t) if head is not None else None

    def _kernel_head(self) -> GGUFLinear | None:
        """The GGUF head whose kernel may answer argmax/top-k without logits (no soft-cap)."""
        embed = self.model.embed_tokens
        head = embed.head if self.lm_head is None and isinstance(embed, GGUFEmbedding) else self.lm_head
        if isinstance(head, GGUFLinear) and head.heap_kernel and self.config.final_logit_softcapping is None:
            return head
        return None

    def hidden(self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache) -> torch.Tensor:
        """input_ids: [T] -> the final norm's output [T, hidden] (every position)."""
        h = self.embed(input_ids)  # [T, hidden]
        rope = self.layer_rope(meta.positions, h.dtype)
        return run_decoder_layers(self.model.layers, self.model.norm, h, rope, meta, kv_cache)

    def logits(self, h: torch.Tensor, out: torch.Tensor | None = None, *, head_dtype: bool = False) -> torch.Tensor:
        """h: [B, hidden] after the final norm -> logits [B, vocab] float32 (soft-capped),
        written into ``out`` when given (a CUDA graph's shared output buffer).

        ``head_dtype``: the head's output as it is (bfloat16 on a GPU) when the model has no
        soft-cap. Its argmax is the float32 logits' argmax (the conversion is exact and keeps
        the order), and it saves the decode graph a copy of [B, vocab] at every step (at batch
        256 on Gemma 3's 262k vocabulary, 134 MB read and 268 MB written: ~0.1 ms on an H200)."""
        logits = self.head(h)  # [B, vocab]
        cap = self.config.final_logit_softcapping
        if head_dtype and cap is None and out is None:
            return logits
        logits = logits.float() if out is None else out.copy_(logits)
        if cap is not None:
            logits = torch.tanh(logits.div_(cap), out=logits).mul_(cap)
        return logits

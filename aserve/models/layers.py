"""Building blocks shared by the model families: norms, rotary embedding, MLP, attention.

Parameter names mirror Hugging Face transformers so checkpoints map one to one.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from aserve.attention.metadata import AttentionMetadata
from aserve.attention.reference import paged_attention
from aserve.models.config import RopeScaling

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


def fused_kernels(x: torch.Tensor) -> ModuleType:
    """The fused ops for ``x``'s device: the Triton kernels on a GPU, the C ones on a CPU
    (same functions, same signatures)."""
    if x.device.type == "cpu":
        from aserve.kernels import cpu_ops

        return cpu_ops
    from aserve.kernels import fused

    return fused


class RMSNorm(nn.Module):
    """RMSNorm; ``gemma=True`` scales by ``(1 + w)`` fully in float32 (as Gemma does),
    otherwise Llama style (normalise in float32, cast back, then multiply by ``w``)."""

    def __init__(self, dim: int, eps: float, gemma: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.gemma = gemma
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))
        self.fused = False  # set by set_fused_ops(): one kernel instead of ~6 eager ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., dim]
        if self.fused:
            return fused_kernels(x).rmsnorm(x, self.weight, self.eps, self.gemma)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gemma:
            return (xf * (1.0 + self.weight.float())).type_as(x)
        return self.weight * xf.to(x.dtype)


def project(proj: nn.Module, x: torch.Tensor, partial: bool = False) -> torch.Tensor:
    """``proj(x)``. With ``partial`` (the result goes straight into a fused :func:`add_norm`), on
    CUDA, for a plain ``nn.Linear`` (not a subclass, no bias) where ``kernels.linear.split_k_launch`` picks a launch for
    this shape: the split-K GEMM's float32 partial products [S, T, N] instead, which the fused
    add + norm kernel sums as it reads them."""
    if partial and x.is_cuda and type(proj) is nn.Linear and proj.bias is None and x.dim() == 2:
        from aserve.kernels.linear import linear, split_k_launch

        n, k = proj.weight.shape
        launch = split_k_launch(x.shape[0], n, k, x.dtype)
        if launch is not None and proj.weight.dtype == x.dtype and proj.weight.stride(-1) == 1:
            return linear(x, proj.weight, launch)
    return proj(x)


def add_norm(
    x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm, x_norm: RMSNorm | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next norm: ``h = residual + x`` (``residual + x_norm(x)`` for
    Gemma's sandwich norms), returns ``(h, norm(h))``. One kernel when fused, which also takes
    ``x`` as split-K partial products (:func:`project`)."""
    if norm.fused:
        assert x_norm is None or x_norm.eps == norm.eps
        xw = None if x_norm is None else x_norm.weight
        return fused_kernels(x).add_rmsnorm(x, residual, norm.weight, norm.eps, norm.gemma, xw)
    h = residual + (x if x_norm is None else x_norm(x))
    return h, norm(h)


def run_decoder_layers(
    layers: nn.ModuleList,
    final_norm: RMSNorm,
    h: torch.Tensor,
    rope: Callable[[nn.Module], tuple[torch.Tensor, torch.Tensor]],
    meta: AttentionMetadata,
    kv_cache: KVCache,
) -> torch.Tensor:
    """The decoder stack on the embeddings ``h`` [T, hidden] -> ``final_norm`` of its output.

    Each layer gets the residual stream and its normalised input, and hands the next layer
    (or the final norm) both, so the add and the next norm can run as one kernel."""
    check_kv_cache(kv_cache, len(layers))
    norms = [*(cast(RMSNorm, layer.input_layernorm) for layer in layers), final_norm]
    x = norms[0](h)
    if h.device.type == "cpu" and final_norm.fused:  # a step of GGUF blocks: all layers in one C call
        plan = cpu_stack_plan(layers, final_norm, kv_cache)
        if plan is not None:
            from aserve.kernels import cpu_ops

            out = cpu_ops.decoder_stack(plan, h, x, [rope(layer) for layer in layers], meta)
            if out is not None:
                return out
    for layer, kv, next_norm in zip(layers, kv_cache, norms[1:], strict=True):
        h, x = layer(h, x, rope(layer), meta, kv, next_norm)
    return x


# cpu_stack_plan's plans by decoder stack: (what it was built for, the plan or None)
_STACK_PLANS: weakref.WeakKeyDictionary[nn.ModuleList, tuple[tuple[int, ...], torch.Tensor | None]] = (
    weakref.WeakKeyDictionary()
)


def cpu_stack_plan(layers: nn.ModuleList, final_norm: RMSNorm, kv_cache: KVCache) -> torch.Tensor | None:
    """The plan for running ``layers`` in one C call (``cpu_ops.decoder_stack``) with this KV
    cache, cached on ``layers`` until the cache or a GGUF projection changes; None where a part
    is not one that call runs (a projection not on GGUF blocks, torch's ops, another layer shape)."""
    from aserve.kernels import cpu_ops, gguf_linear

    key = (gguf_linear.generation, *(t.data_ptr() for kv in kv_cache for t in kv))
    cached = _STACK_PLANS.get(layers)
    if cached is not None and cached[0] == key:
        return cached[1]
    nexts = [*(cast(RMSNorm, layer.input_layernorm) for layer in list(layers)[1:]), final_norm]
    records = [_stack_record(layer, nxt, kv) for layer, nxt, kv in zip(layers, nexts, kv_cache, strict=True)]
    plan = None
    if all(r is not None for r in records):
        plan = cpu_ops.pack_plan([r for r in records if r is not None])
    _STACK_PLANS[layers] = (key, plan)
    return plan


def _stack_record(layer: nn.Module, next_norm: RMSNorm, kv: tuple[torch.Tensor, torch.Tensor]) -> bytes | None:
    from aserve.kernels import cpu_ops
    from aserve.kernels.gguf_linear import GGUFLinear

    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if not isinstance(attn, PagedSelfAttention) or not isinstance(mlp, GatedMLP):
        return None
    projs = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    if not all(isinstance(p, GGUFLinear) and p.qtype in cpu_ops.STACK_QTYPES and not p.int8_activations
               for p in projs):  # fmt: skip
        return None
    attn_out, mlp_in, mlp_out = layer.norms()  # type: ignore[operator]
    sandwich = [n for n in (attn_out, mlp_out, next_norm) if n is not None]
    if not mlp_in.fused or any(n.gemma != mlp_in.gemma or n.eps != mlp_in.eps for n in sandwich):
        return None
    qk = [n for n in (attn.q_norm, attn.k_norm) if n is not None]
    if any(not n.gemma or n.eps != qk[0].eps for n in qk) or kv[0].dtype != torch.float32:
        return None
    norms = [attn.q_norm, attn.k_norm, attn_out, mlp_in, mlp_out, next_norm]
    return cpu_ops.layer_record(
        cast(list[GGUFLinear], projs), [None if n is None else n.weight for n in norms], kv,
        (attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.sliding_window or 0), mlp_in.gemma, mlp.act,
        (mlp_in.eps, qk[0].eps if qk else 0.0), attn.scale, attn.softcap,
    )  # fmt: skip


def rope_inv_freq(head_dim: int, base: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in float32, with optional linear / Llama 3 scaling."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # Llama 3: keep high frequencies, divide low ones by ``factor``, blend in between.
    old_ctx = scaling.original_max_position_embeddings
    low_wavelen = old_ctx / scaling.low_freq_factor
    high_wavelen = old_ctx / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_ctx / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


# ``ASERVE_MLP_KERNEL=triton``: the gate/up GEMM and the gated activation as one Triton kernel
# (``fused.gate_up_gated``) where fused ops run on a GPU; off until measured against cuBLAS.
_MLP_KERNEL = os.environ.get("ASERVE_MLP_KERNEL", "cublas") == "triton"
# ``ASERVE_ROPE=torch`` keeps torch's ops for the rotary table where fused ops are on (to measure).
_ROPE_KERNEL = os.environ.get("ASERVE_ROPE", "kernel") != "torch"


class Rotary:
    """NeoX / HF "rotate_half" rotary embedding. Not an ``nn.Module``: it holds no weights,
    so models can be built on the meta device and the frequencies stay exact float32."""

    def __init__(self, head_dim: int, base: float, scaling: RopeScaling | None) -> None:
        self.inv_freq = rope_inv_freq(head_dim, base, scaling)  # [D/2] float32 on CPU
        self._on_device: dict[torch.device, torch.Tensor] = {}
        self.fused = False  # set by set_fused_ops(): one Triton kernel on a GPU

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] int64 -> cos, sin: [T, 1, D] in ``dtype`` (computed in float32)."""
        dev = positions.device
        inv = self._on_device.get(dev)
        if inv is None:
            inv = self._on_device[dev] = self.inv_freq.to(dev)
        if self.fused and dev.type == "cuda" and _ROPE_KERNEL:
            from aserve.kernels.fused import cos_sin

            return cos_sin(positions, inv, dtype)
        freqs = positions.float()[:, None] * inv[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, D]; cos/sin: [T, 1, D]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = act
        self.fused = False
        self.gate_up_weight: torch.Tensor | None = None  # [2 * inter, hidden], see pack_weights

    def pack_weights(self) -> None:
        """One [gate; up] weight so the fused path runs one GEMM; the two projections'
        weights become views into it (no extra memory). Call after the weights are loaded.
        GGUF-block projections (no ``.weight``) stay as they are."""
        if self.gate_up_weight is None and isinstance(self.gate_proj, nn.Linear):
            w = torch.cat([self.gate_proj.weight.data, self.up_proj.weight.data])
            inter = self.gate_proj.weight.shape[0]
            self.gate_proj.weight.data, self.up_proj.weight.data = w[:inter], w[inter:]
            self.gate_up_weight = w

    def forward(self, x: torch.Tensor, partial: bool = False) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden]; with partial, maybe split-K partials (see project)
        if self.fused:
            if self.gate_up_weight is not None and x.is_cuda and _MLP_KERNEL:
                from aserve.kernels.fused import gate_up_gated

                return project(self.down_proj, gate_up_gated(x, self.gate_up_weight, self.act), partial)
            if self.gate_up_weight is not None:
                inter = self.gate_proj.weight.shape[0]
                gu = F.linear(x, self.gate_up_weight)  # [T, 2 * inter]
                gate, up = gu[:, :inter], gu[:, inter:]
            else:
                gate, up = self.gate_proj(x), self.up_proj(x)
            return project(self.down_proj, fused_kernels(x).gated(gate, up, self.act), partial)
        gate = self.gate_proj(x)  # [T, inter]
        gate = F.gelu(gate, approximate="tanh") if self.act == "gelu_tanh" else F.silu(gate)
        return self.down_proj(gate * self.up_proj(x))


class PagedSelfAttention(nn.Module):
    """q/k/v projections (optional bias, optional per-head q/k RMSNorm), rotary, paged attention."""

    def __init__(
        self,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        bias: bool,
        qk_norm_eps: float | None,
        scale: float,
        sliding_window: int | None,
        softcap: float | None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.softcap = softcap
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.fused = False
        self.qkv_weight: torch.Tensor | None = None  # [(H + 2 Hkv) D, hidden], see pack_weights
        self.qkv_bias: torch.Tensor | None = None
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, gemma=True)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, gemma=True)

    def pack_weights(self) -> None:
        """One [q; k; v] weight (and bias) so the fused path runs one GEMM; the projections'
        weights become views into it (no extra memory). Call after the weights are loaded.
        GGUF-block projections (no ``.weight``) stay as they are."""
        if self.qkv_weight is not None or not isinstance(self.q_proj, nn.Linear):
            return
        projs = (self.q_proj, self.k_proj, self.v_proj)
        w = torch.cat([p.weight.data for p in projs])
        b = torch.cat([p.bias.data for p in projs]) if self.q_proj.bias is not None else None
        start = 0
        for p in projs:
            n = p.weight.shape[0]
            p.weight.data = w[start : start + n]
            if b is not None:
                p.bias.data = b[start : start + n]
            start += n
        self.qkv_weight, self.qkv_bias = w, b

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        kv: tuple[torch.Tensor, torch.Tensor],
        partial: bool = False,
    ) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden]; with partial, maybe split-K partials (see project)
        t = x.shape[0]
        if self.fused and self.qkv_weight is not None and meta.backend == "triton" and self.softcap is None:
            return self._forward_fused(x, cos_sin, meta, kv, partial)
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.fused and self.qkv_weight is not None:
            qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
            q, k, v = (u.view(t, -1, d) for u in qkv.split([h * d, hkv * d, hkv * d], dim=1))
        else:
            q = self.q_proj(x).view(t, h, d)  # [T, H, D]
            k = self.k_proj(x).view(t, hkv, d)  # [T, Hkv, D]
            v = self.v_proj(x).view(t, hkv, d)  # [T, Hkv, D]
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        cos, sin = cos_sin
        if self.fused:
            ops = fused_kernels(q)
            q, k = ops.rotary(q, cos, sin), ops.rotary(k, cos, sin)
        else:
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        if meta.backend == "triton" and self.softcap is None:
            from aserve.attention.triton_paged import paged_attention_triton

            out = paged_attention_triton(q, k, v, kv[0], kv[1], meta, self.scale, self.sliding_window)  # [T, H, D]
        elif self.fused and q.device.type == "cpu":
            from aserve.kernels.cpu_ops import attention

            out = attention(q, k, v, kv[0], kv[1], meta, self.scale, self.sliding_window, self.softcap)
        else:
            out = paged_attention(q, k, v, kv[0], kv[1], meta, self.scale, self.sliding_window, self.softcap)
        return project(self.o_proj, out.reshape(t, self.num_heads * self.head_dim), partial)

    def _forward_fused(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        kv: tuple[torch.Tensor, torch.Tensor],
        partial: bool = False,
    ) -> torch.Tensor:
        """One GEMM for q/k/v, one kernel for norms + rotary + cache write, then attention:
        the same arithmetic as ``forward``'s fused-op path in three launches instead of ~8."""
        from aserve.attention.triton_paged import attend_triton
        from aserve.kernels.fused import qkv_prep

        assert self.qkv_weight is not None
        t = x.shape[0]
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)  # [T, (H + 2 Hkv) D]
        qn, kn = self.q_norm, self.k_norm
        q = qkv_prep(
            qkv, self.num_heads, self.num_kv_heads, self.head_dim,
            None if qn is None else qn.weight, None if kn is None else kn.weight,
            0.0 if qn is None else qn.eps, qn is not None and qn.gemma,
            cos_sin[0], cos_sin[1], meta.out_cache_loc, kv[0], kv[1],
        )  # fmt: skip
        out = attend_triton(q, kv[0], kv[1], meta, self.scale, self.sliding_window)  # [T, H, D]
        return project(self.o_proj, out.reshape(t, self.num_heads * self.head_dim), partial)


def set_fused_ops(model: nn.Module, on: bool) -> None:
    """Switch every norm, MLP and attention block of ``model`` to the fused kernels (Triton on
    a GPU, C on a CPU: ``fused_kernels``), packing each block's projection weights where they
    are ``nn.Linear`` (``pack_weights``)."""
    for module in model.modules():
        if isinstance(module, (RMSNorm, GatedMLP, PagedSelfAttention)):
            module.fused = on
        for rope in (v for v in vars(module).values() if isinstance(v, Rotary)):
            rope.fused = on
        if on and isinstance(module, (GatedMLP, PagedSelfAttention)):
            module.pack_weights()


def check_kv_cache(kv_cache: KVCache, num_layers: int) -> None:
    assert len(kv_cache) == num_layers, f"kv_cache has {len(kv_cache)} layers, model {num_layers}"

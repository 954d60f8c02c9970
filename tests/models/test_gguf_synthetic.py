"""Tiny GGUF files written the way llama.cpp's converter writes them (q/k permuted for
Llama, ``+1`` folded into Gemma norms, Llama 3 scaling as ``rope_freqs``), loaded by us
and compared with the transformers model they came from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from aserve.models.gguf_loader import read_gguf_tensors
from aserve.models.layers import rope_inv_freq
from aserve.models.loader import load_model
from tests.models.paged import PagedRunner
from tests.models.test_hf_parity import VOCAB, _gemma3, _llama, _prompt

_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "post_feedforward_layernorm": "post_ffw_norm", "pre_feedforward_layernorm": "ffn_norm",
}  # fmt: skip


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf: interleave the two rotary halves of every head.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(hf: Any, arch: str, path: Path, quantized: bool = False) -> None:
    """``quantized``: 2-D weights as llama.cpp's Q4_K_M mix stores them for rows of 32-multiples
    (Q5_0 for q/k/gate/up, Q8_0 for the rest and the embedding), quantized by gguf-py."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    c = hf.config
    w = GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_context_length(c.max_position_embeddings)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    if arch == "gemma3":
        w.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
        w.add_sliding_window(c.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
    else:
        rp = c.rope_parameters
        w.add_rope_freq_base(rp["rope_theta"])
        plain = rope_inv_freq(c.head_dim, rp["rope_theta"], None)
        from aserve.models.config import RopeScaling

        scaled = rope_inv_freq(c.head_dim, rp["rope_theta"], RopeScaling("llama3", rp["factor"]))
        w.add_tensor("rope_freqs.weight", (plain / scaled).numpy())
    for name, t in hf.state_dict().items():
        a = t.float().numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            if c.tie_word_embeddings:
                continue
            gname = "output.weight"
        else:
            parts = name.split(".")  # model.layers.{i}.{module...}.{weight|bias}
            module = ".".join(parts[3:-1])
            if arch == "gemma3" and module == "post_attention_layernorm":
                g = "post_attention_norm"
            elif module == "post_attention_layernorm":
                g = "ffn_norm"
            else:
                g = _NAMES[module]
            gname = f"blk.{parts[2]}.{g}.{parts[-1]}"
            if arch == "llama" and g == "attn_q":
                a = _permute(a, c.num_attention_heads)
            elif arch == "llama" and g == "attn_k":
                a = _permute(a, c.num_key_value_heads)
        if arch == "gemma3" and gname.endswith("norm.weight"):
            a = a + 1.0
        if quantized and a.ndim == 2 and a.shape[1] % 32 == 0:
            five = any(f".{g}." in gname for g in ("attn_q", "attn_k", "ffn_gate", "ffn_up"))
            qtype = GGMLQuantizationType.Q5_0 if five else GGMLQuantizationType.Q8_0
            w.add_tensor(gname, quantize(np.ascontiguousarray(a), qtype), raw_dtype=qtype)
            continue
        w.add_tensor(gname, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_gguf_conventions(arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASERVE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(1)
    hf = _gemma3() if arch == "gemma3" else _llama()
    hf.config.rope_parameters["full_attention" if arch == "gemma3" else "rope_type"] = (
        {"rope_type": "default", "rope_theta": 1e6} if arch == "gemma3" else "llama3"
    )
    if arch == "gemma3":
        hf.config.query_pre_attn_scalar = hf.config.head_dim  # GGUF has no such key
        hf.config.final_logit_softcapping = None
        hf = type(hf)(hf.config)
    else:
        hf.config.rope_parameters["original_max_position_embeddings"] = 8192
        hf = type(hf)(hf.config)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.eval()
    path = tmp_path / f"tiny-{arch}.gguf"
    _write_gguf(hf, arch, path)
    calls: list[tuple[int, int]] = []
    cfg0, _, _ = read_gguf_tensors(path, progress=lambda d, t: calls.append((d, t)))
    assert calls and calls[-1][0] == calls[-1][1]
    assert cfg0.vocab_size == VOCAB and cfg0.eos_token_ids == (1,)
    for attempt in range(2):  # second load comes from the dequantized cache
        cfg, model, _ = load_model(str(path), torch.float32, torch.device("cpu"))
        assert cfg == cfg0
        ids = _prompt(12, 9)
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
        r = PagedRunner(model, cfg, torch.float32)
        got = [r.step([(0, ids[:6])])[0]] + [r.step([(0, [t])])[0] for t in ids[6:]]
        diff = (torch.log_softmax(torch.stack(got), -1) - ref[5:]).abs().max().item()
        assert diff < 1e-3, (attempt, diff)
    assert list((tmp_path / "cache").glob("*.safetensors"))


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_gguf_blocks_equal_the_dequantized_path(arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantized synthetic GGUFs (Llama's q/k rows permuted in block form): the model on GGUF
    blocks gives the float32 path's logits (gguf-py dequantized, torch matmul)."""
    from aserve.kernels.gguf_linear import GGUFEmbedding, GGUFLinear, kernel

    if kernel() is None:
        pytest.skip("GGUF CPU kernel not built")
    monkeypatch.setenv("ASERVE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(2)
    hf = _gemma3() if arch == "gemma3" else _llama()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    path = tmp_path / f"tiny-q-{arch}.gguf"
    _write_gguf(hf, arch, path, quantized=True)
    ids = _prompt(12, 9)
    logits = []
    for blocks in (False, True):
        cfg, model, _ = load_model(str(path), torch.float32, torch.device("cpu"), gguf_blocks=blocks)
        kinds = {type(m) for m in model.modules()}
        assert (GGUFLinear in kinds and GGUFEmbedding in kinds) == blocks
        r = PagedRunner(model, cfg, torch.float32)
        logits.append(torch.stack([r.step([(0, ids[:6])])[0]] + [r.step([(0, [t])])[0] for t in ids[6:]]))
    assert torch.allclose(logits[1], logits[0], rtol=0, atol=1e-4), (logits[1] - logits[0]).abs().max()

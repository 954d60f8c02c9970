"""Engine configuration: frozen, with derived values as properties, and its command-line flags."""

from __future__ import annotations

import argparse
import importlib.util
import types
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin, get_type_hints

from aserve.errors import InvalidRequestError

if TYPE_CHECKING:
    import torch

# torch is imported where a device or dtype is resolved, not here: `aserve --help` and the
# flag parsing of every subcommand read this module, and importing torch costs seconds.
_DTYPES = ("float32", "bfloat16", "float16", "gguf")


@dataclass(frozen=True)
class EngineConfig:
    """Everything fixed at start-up. Runtime-discovered values (KV capacity, EOS ids) live on the engine."""

    model: str = "gemma-3-270m"
    device: str | None = None  # "cpu", "cuda", "cuda:1"; None picks CUDA when available
    # "gguf": a GGUF model's quantized weights stay llama.cpp's blocks and run on aserve's CPU
    # kernel (activations and KV float32); "float32" dequantizes them (the reference path).
    # None: bfloat16 on a GPU; on a CPU "gguf" for a GGUF model (float32 where the kernel was
    # not built), else float32.
    dtype: Literal["float32", "bfloat16", "float16", "gguf"] | None = None
    # With GGUF blocks: the LM head's activations. "int8": rounded to 8 bits per block of 32
    # as llama.cpp does, each block's dot product in integers (a Q8_0 head only). None: int8
    # for a Q8_0 head on a CPU with AVX-512 VNNI (faster, and within issue 20's quality bar),
    # else float32. The other layers always take float32 activations.
    gguf_head: Literal["float32", "int8"] | None = None
    # With GGUF blocks: the matmuls of a prefill of 32+ tokens and of a decode step of 7+
    # streams in "bfloat16" (operands rounded, float32 accumulation) or "float32". None:
    # bfloat16 on a CPU with AVX-512 BF16 (1.4-2.4x the speed, within issue 20's quality bar),
    # else float32. Smaller steps always run the kernel in float32, so a stream's numbers can
    # differ in the last bits with the number of streams beside it.
    gguf_prefill: Literal["float32", "bfloat16"] | None = None
    overlap: bool = True  # pipeline depth 2 or 3 (overlap_depth); False runs the same code at depth 1
    # Steps planned or in flight but not committed when overlap is on. 2 is SGLang's scheme
    # (the host commits n-1 and plans n+1 while the device runs n); 3 lets the host run one
    # more step ahead, so one slow host step does not idle the device. Requests with
    # penalties stay at a look-ahead of one step (their sampler reads committed outputs).
    # None: 3 on the CUDA fast path (decode graphs), where a device step is about as long as
    # the host's work for it (H200, W2 steady idle: 7-15% at 2, a median 1.2% over ten runs
    # at 3; docs/benchmarks.md); 2 elsewhere.
    overlap_depth: int | None = None
    # A stream's consumer is woken for its first token, then once this many tokens wait
    # (and at the end): fewer, larger chunks for less per-token host work on the loop that
    # also plans and commits. 1 sends every token as it commits (SGLang's --stream-interval).
    stream_interval: int = 1
    radix_cache: bool = True  # reuse the KV of shared prefixes (--disable-radix-cache)
    # "torch": the reference path (padded SDPA). "triton": aserve/attention/triton_paged.py.
    # "auto": Triton on CUDA (when triton is installed), the reference on a CPU.
    attention_backend: Literal["auto", "torch", "triton"] = "auto"
    # Triton RMSNorm (+ residual) / rotary / gated activation (aserve/kernels/fused.py);
    # None: on with CUDA and triton, off on a CPU.
    fused_ops: bool | None = None
    # Decode steps replayed from CUDA graphs (needs the Triton attention); None: on with CUDA
    # and triton (--disable-cuda-graph). On a CPU, True runs the same static-buffer path uncaptured.
    cuda_graph: bool | None = None
    # With cuda_graph on, steps that carry a prompt chunk (prefills, mixed batches) of up to
    # this many tokens replay from CUDA graphs too, padded to a token ladder
    # (aserve/device/extend_graphs.py). None: max_num_batched_tokens; 0: decode steps only.
    cuda_graph_max_tokens: int | None = None
    schedule_policy: Literal["fcfs", "lpm"] = "fcfs"  # lpm: longest cached prefix first (long queues)
    page_size: int = 16
    kv_cache_bytes: int | None = None  # KV budget in bytes; None derives it from mem_fraction
    mem_fraction: float = 0.5  # of free device memory (CUDA) for KV when kv_cache_bytes is None
    cpu_kv_cache_bytes: int = 512 * 2**20  # default KV budget on CPU
    max_context: int | None = None  # None: the model's, capped at 8192 on CPU
    # Token budget of one step (chunked prefill beyond it) and the most requests decoding at
    # once (also the largest decode CUDA graph). None: sized from the device at start-up
    # (aserve/scheduler/sizing.py: on a GPU from its memory and the KV pool; 2048 and 64 on a CPU).
    max_num_batched_tokens: int | None = None
    max_running_requests: int | None = None
    max_waiting_requests: int = 4096
    seed: int = 0  # seeds the per-request seeds of requests that do not give one
    debug: bool = False  # FutureMap poisoning and extra invariant checks
    warmup: bool = True
    num_threads: int | None = None  # torch intra-op threads on CPU
    log_format: Literal["console", "json"] = "console"
    trace_path: str | None = None  # write a Chrome trace-event JSON of the run here on exit
    # How a coroutine awaits a CUDA event: ask query() at every pass of the loop ("spin", the
    # default: the loop's thread stays busy while a step runs), ask it with a 50 us sleep
    # between asks ("poll": on an otherwise idle asyncio loop that sleep lasts a millisecond,
    # epoll's resolution), or block a helper thread in cudaEventSynchronize. Measured on the
    # H100 host, engine alone: spin 99-107k tok/s against poll 73-91k (docs/benchmarks.md).
    cuda_event_wait: Literal["poll", "spin", "thread"] = "spin"
    # Move every object alive after start-up (torch, transformers, the model's Python
    # objects: hundreds of thousands) out of the cyclic garbage collector's reach, as vLLM
    # does, so a collection does not traverse them on the loop that launches steps (a full
    # one took 0.23 s on a 2-core VM; W2 on the H200 saw 1-7.6 ms gen1 pauses without it,
    # none with it). gc.freeze(), undone by aclose. None: on with CUDA, off on a CPU.
    gc_freeze: bool | None = None
    # Seconds a launched step may take to complete on the device before the engine declares
    # it stalled (SGLang's --watchdog-timeout, also 300 s): every request in flight then ends
    # with EngineFailedError and the engine closes, since a stalled device cannot be trusted.
    # None or 0 disables it.
    watchdog_timeout: float | None = 300.0

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise InvalidRequestError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}", param="dtype")
        if self.gguf_head not in (None, "float32", "int8"):
            raise InvalidRequestError(f"gguf_head must be float32 or int8, got {self.gguf_head!r}", param="gguf_head")
        if self.gguf_prefill not in (None, "float32", "bfloat16"):
            raise InvalidRequestError(f"gguf_prefill must be float32 or bfloat16, got {self.gguf_prefill!r}",
                                      param="gguf_prefill")  # fmt: skip
        if self.page_size < 1:
            raise InvalidRequestError("page_size must be >= 1", param="page_size")
        if self.max_context is not None and self.max_context < 2:  # a prompt token and an output
            raise InvalidRequestError(f"max_context must be >= 2, got {self.max_context}", param="max_context")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise InvalidRequestError("mem_fraction must be in (0, 1]", param="mem_fraction")
        if self.cuda_graph and self.resolved_attention_backend != "triton":
            raise InvalidRequestError("cuda_graph needs attention_backend='triton'", param="cuda_graph")
        if self.cuda_event_wait not in ("poll", "spin", "thread"):
            raise InvalidRequestError(f"cuda_event_wait must be poll, spin or thread, got {self.cuda_event_wait!r}",
                                      param="cuda_event_wait")  # fmt: skip
        if self.overlap_depth not in (None, 2, 3):
            raise InvalidRequestError("overlap_depth must be 2 or 3", param="overlap_depth")
        if self.watchdog_timeout is not None and self.watchdog_timeout < 0:
            raise InvalidRequestError("watchdog_timeout must be >= 0 (0 disables it)", param="watchdog_timeout")
        if self.stream_interval < 1:
            raise InvalidRequestError("stream_interval must be >= 1", param="stream_interval")
        if self.max_waiting_requests < 1:  # 0 would refuse every request
            raise InvalidRequestError("max_waiting_requests must be >= 1", param="max_waiting_requests")
        if (self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1) or (
            self.max_running_requests is not None and self.max_running_requests < 1
        ):
            raise InvalidRequestError("max_num_batched_tokens and max_running_requests must be >= 1")
        if self.cuda_graph_max_tokens is not None and self.cuda_graph_max_tokens < 0:
            raise InvalidRequestError("cuda_graph_max_tokens must be >= 0", param="cuda_graph_max_tokens")

    @property
    def resolved_overlap_depth(self) -> int:
        if self.overlap_depth is not None:
            return self.overlap_depth
        return 3 if self.torch_device.type == "cuda" and self.use_cuda_graph else 2

    @property
    def pipeline_depth(self) -> int:
        return self.resolved_overlap_depth if self.overlap else 1

    @property
    def torch_device(self) -> torch.device:
        import torch

        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    @property
    def resolved_attention_backend(self) -> Literal["torch", "triton"]:
        if self.attention_backend != "auto":
            return self.attention_backend
        return "triton" if self._fast_path_available else "torch"

    @property
    def use_fused_ops(self) -> bool:
        return self._fast_path_available if self.fused_ops is None else self.fused_ops

    @property
    def use_cuda_graph(self) -> bool:
        if self.cuda_graph is not None:
            return self.cuda_graph
        return self._fast_path_available and self.resolved_attention_backend == "triton"

    @property
    def _fast_path_available(self) -> bool:
        """CUDA with triton importable: the Triton kernels and CUDA graphs are the defaults."""
        if self.torch_device.type != "cuda":
            return False
        return importlib.util.find_spec("triton") is not None

    @property
    def watchdog_s(self) -> float | None:
        """The watchdog's limit in seconds, or None when it is off."""
        return self.watchdog_timeout or None

    @property
    def use_gc_freeze(self) -> bool:
        return self.torch_device.type == "cuda" if self.gc_freeze is None else self.gc_freeze

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        if self.dtype == "gguf":
            return torch.float32  # activations and KV; the weights stay GGUF blocks
        if self.dtype is not None:
            return getattr(torch, self.dtype)  # type: ignore[no-any-return]
        return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(**kwargs)


# Command-line flags: one per EngineConfig field, shared by every `aserve` subcommand that
# starts an engine (generate, info, verify, serve). Every field has its help line here (a test
# checks it); a field whose default is None says there what "unset" picks.
FLAG_HELP: dict[str, str] = {
    "model": "a GGUF file, a Hugging Face checkpoint directory, or a bundled model's name",
    "device": "cpu, cuda or cuda:N (default: cuda when available, else cpu)",
    "dtype": "weights and activations; gguf: keep a GGUF's quantized weights and run them on the CPU kernel "
    "(default: gguf for a GGUF model on a CPU where the kernel is built, else float32 on a CPU; bfloat16 on a GPU)",
    "gguf_head": "with GGUF blocks, the LM head's activations: float32, or int8 (per block of 32 with integer "
    "dot products, llama.cpp's method; a Q8_0 head) (default: int8 on a CPU with AVX-512 VNNI, else float32)",
    "gguf_prefill": "with GGUF blocks, the matmuls of prefills of 32+ tokens and decode steps of 7+ streams in "
    "bfloat16 or float32 (default: bfloat16 on a CPU with AVX-512 BF16, else float32)",
    "overlap": "run the scheduler serially (pipeline depth 1); the tokens are the same",
    "overlap_depth": "steps planned or in flight ahead of the commit with overlap on, 2 or 3 "
    "(default: 3 with CUDA graphs, else 2)",
    "stream_interval": "wake a stream's reader for its first token, then every N tokens",
    "radix_cache": "do not reuse the KV of shared prefixes",
    "attention_backend": "paged attention kernels (auto: triton on CUDA, torch on a CPU)",
    "fused_ops": "fused RMSNorm/rotary/activation kernels: Triton on CUDA (default: on with triton), C on a CPU (attention too; default: on with GGUF blocks)",
    "cuda_graph": "decode, prefill and mixed steps replayed from CUDA graphs (default: on with CUDA and triton)",
    "cuda_graph_max_tokens": "with CUDA graphs on, prefill and mixed steps of up to this many tokens replay "
    "from graphs too (default: the step's token budget; 0: decode steps only)",
    "schedule_policy": "waiting-queue order: fcfs, or lpm (longest cached prefix first)",
    "page_size": "tokens per KV page",
    "kv_cache_bytes": "KV cache budget in bytes (default: --mem-fraction of free GPU memory, "
    "--cpu-kv-cache-bytes on a CPU)",
    "mem_fraction": "share of free GPU memory given to the KV cache",
    "cpu_kv_cache_bytes": "KV cache budget on a CPU",
    "max_context": "longest prompt plus output, in tokens (default: the model's, capped at 8192 on a "
    "CPU and at what the KV pool holds)",
    "max_num_batched_tokens": "token budget of one step, longer prompts are chunked (default: sized "
    "from the device at start-up; 2048 on a CPU)",
    "max_running_requests": "most requests decoding at once (default: sized from the device at start-up; 64 on a CPU)",
    "max_waiting_requests": "queued requests beyond which new ones get 429",
    "seed": "seed of the requests that do not give one",
    "debug": "poison freed future slots and check scheduler invariants every step (slow)",
    "warmup": "run one prefill and one decode before serving",
    "num_threads": "torch intra-op threads on a CPU (default: the CPUs this process may run on, within its cgroup quota)",
    "log_format": "console lines for people, json lines for log collectors",
    "trace_path": "on exit, write a Chrome trace (chrome://tracing, Perfetto) of every step here",
    "cuda_event_wait": "how the loop awaits a CUDA event: ask at every pass of the loop (spin, a busy core while "
    "a step runs), every 50 us (poll; a millisecond on an idle asyncio loop), or block a helper thread",
    "gc_freeze": "move start-up objects out of the garbage collector's reach and collect its youngest generation "
    "every 50,000 allocations instead of 700 while serving (default: on with CUDA)",
    "watchdog_timeout": "seconds a launched step may take on the device before the engine is declared "
    "stalled and stops (0 disables it)",
}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig field (``--max-running-requests 32``, ``--disable-overlap``)."""
    hints = get_type_hints(EngineConfig)
    group = parser.add_argument_group("engine options")
    for f in fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        typ = hints[f.name]
        text = FLAG_HELP[f.name]
        if f.name == "overlap":
            group.add_argument("--disable-overlap", dest="overlap", action="store_false", help=text)
            continue
        if f.name == "radix_cache":
            group.add_argument("--disable-radix-cache", dest="radix_cache", action="store_false", help=text)
            continue
        if f.name == "cuda_graph":  # --disable-cuda-graph, as in SGLang; --cuda-graph forces it on
            group.add_argument("--disable-cuda-graph", dest="cuda_graph", action="store_false", default=None,
                               help="run every step eagerly (no CUDA graphs)")  # fmt: skip
            group.add_argument("--cuda-graph", dest="cuda_graph", action="store_true", default=None, help=text)
            continue
        default = f.default if f.default is not MISSING else None
        if default is not None:  # a None default is explained in the text itself
            text += " (default: %(default)s)"
        if typ is bool or _base_type(typ) is bool:  # bool | None: unset means "auto"
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=text)
            continue
        kwargs: dict[str, Any] = {"dest": f.name, "default": default, "help": text}
        choices = _literal_choices(typ)
        if choices:
            kwargs["choices"] = choices
        else:
            kwargs["type"] = _base_type(typ)
        group.add_argument(flag, **kwargs)


def _base_type(typ: Any) -> Any:
    if get_origin(typ) in (Union, types.UnionType):
        args = [a for a in get_args(typ) if a is not type(None)]
        return _base_type(args[0])
    if typ in (bool, int, float, str):
        return typ
    return str


def _literal_choices(typ: Any) -> list[str] | None:
    if get_origin(typ) in (Union, types.UnionType):
        for a in get_args(typ):
            c = _literal_choices(a)
            if c:
                return c
        return None
    if str(get_origin(typ)).endswith("Literal"):
        return [str(a) for a in get_args(typ)]
    return None


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    values = {f.name: getattr(args, f.name) for f in fields(EngineConfig) if hasattr(args, f.name)}
    return EngineConfig(**values)

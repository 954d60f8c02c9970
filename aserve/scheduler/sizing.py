"""Batch sizes chosen from the device when the user leaves them unset.

A GPU with room to spare runs more requests at once and bigger prefill chunks; a small one,
or a CPU, keeps today's sizes (64 running requests, 2048 tokens a step). On CUDA:

* ``max_num_batched_tokens`` (the token budget of one step, so the prefill chunk size) by
  device memory, as SGLang sizes its chunked-prefill default: 2048 under 24 GiB, 4096 under
  60 GiB, 8192 above.
* ``max_running_requests`` (also the largest decode CUDA graph) by how many requests the KV
  pool holds at ``_TOKENS_PER_REQUEST`` tokens each, capped by device memory (64 under 24 GiB,
  128 under 60 GiB, 256 above) and at least 16, in multiples of 8. Measured on the H200
  (docs/benchmarks.md, issue 15): W1 on the Gemma 3 270M shape ran 1.4x faster at 256 running
  requests and 8192 tokens a step than at 64 and 2048.

Pure policy (tests/test_purity.py): no torch, no device; ``aserve.engine.setup`` passes in what it
measured.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
CPU_MAX_RUNNING = 64
CPU_MAX_BATCHED_TOKENS = 2048
# KV a running request is budgeted on average when sizing the batch from the pool: with
# fewer tokens per request in the pool than this, more running requests would mostly wait
# for KV (and retract each other) instead of decoding.
_TOKENS_PER_REQUEST = 1024


@dataclass(frozen=True)
class BatchSizes:
    max_running_requests: int
    max_num_batched_tokens: int
    why: str  # logged at start-up: where each value came from


def choose_batch_sizes(
    device_type: str,
    device_memory: int | None,
    kv_tokens: int,
    max_running_requests: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> BatchSizes:
    """The sizes to run with: the user's where given, else sized from the device.

    ``device_memory``: the device's total memory in bytes (None on a CPU); ``kv_tokens``:
    the KV pool's capacity in tokens."""
    why: list[str] = []
    gpu_memory = device_memory if device_type == "cuda" else None
    if max_num_batched_tokens is not None:
        batched = max_num_batched_tokens
        why.append("max_num_batched_tokens given")
    elif gpu_memory is None:
        batched = CPU_MAX_BATCHED_TOKENS
        why.append(f"max_num_batched_tokens {batched} (CPU default)")
    else:
        batched = _by_memory(gpu_memory, 2048, 4096, 8192)
        why.append(f"max_num_batched_tokens {batched} ({gpu_memory / GIB:.0f} GiB device)")
    if max_running_requests is not None:
        running = max_running_requests
        why.append("max_running_requests given")
    elif gpu_memory is None:
        running = CPU_MAX_RUNNING
        why.append(f"max_running_requests {running} (CPU default)")
    else:
        cap = _by_memory(gpu_memory, 64, 128, 256)
        by_kv = kv_tokens // _TOKENS_PER_REQUEST
        running = max(16, min(cap, by_kv) // 8 * 8)
        limit = "device memory" if cap <= by_kv else f"KV for {_TOKENS_PER_REQUEST} tokens each"
        why.append(f"max_running_requests {running} ({limit}: {kv_tokens} KV tokens, cap {cap})")
    return BatchSizes(running, batched, "; ".join(why))


def _by_memory(memory: int, small: int, mid: int, large: int) -> int:
    """``small`` under 24 GiB of device memory, ``mid`` under 60 GiB, ``large`` above."""
    return small if memory < 24 * GIB else mid if memory < 60 * GIB else large

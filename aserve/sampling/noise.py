"""Counter-based randomness for the sampler: seeded uniforms that do not depend on the batch.

The uniform behind ``E_i = -log(U_i)`` (the exponential race of :mod:`aserve.sampling.sampler`)
is a pure function of ``(seed, step, token index)`` computed with integer tensor ops, so a
request draws the same tokens whatever else is in the batch, at whatever row, on CPU or CUDA.
The hash (all values are kept in ``[0, 2**32)`` inside int64 tensors; every multiplier is odd
and below ``2**31`` so a product of a 32-bit value and a multiplier is below ``2**63`` and
int64 never overflows):

* ``mix32(x)``: ``x ^= x >> 16; x = x * 0x7FEB352D mod 2**32; x ^= x >> 15;
  x = x * 0x21F0AAAD mod 2**32; x ^= x >> 16`` -- a bijective xorshift-multiply finaliser
  in the style of murmur3's fmix32 / "lowbias32" (both multipliers appear in Chris
  Wellons' hash-prospector results).
* row key (``[B]``, cheap): ``k = mix32(seed_hi ^ 0x3C6EF372); k = mix32(k ^ seed_lo);
  k = mix32(k ^ step_lo)``.
* token hash (``[V]``, cached per vocab size and device): ``h_i = mix32(mix32(i) ^ 0x5851F42D)``.
* per element: ``x = mix32(h_i ^ k)``; ``U = (x >> 9 + 0.5) / 2**23``, a float32 that is
  exact (24 significant bits) and lies strictly inside (0, 1), so ``E = -log U`` is finite
  and positive.

Because ``mix32`` is a strong bijection and ``h_i`` spreads token indices over the whole
32-bit space, two different keys see practically disjoint pseudo-random inputs, so draws for
different steps/seeds behave as independent.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["uniform_noise"]

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31: (x < 2**32) * m < 2**63, so int64 products never overflow.
_MUL1 = 0x7FEB352D
_MUL2 = 0x21F0AAAD
_SEED_SALT = 0x3C6EF372
_TOKEN_SALT = 0x5851F42D
_INV_2_23 = 1.0 / float(1 << 23)


def _mix32(x: Tensor) -> Tensor:
    """Out-of-place 32-bit finaliser on int64 values in [0, 2**32) (small tensors)."""
    x = x ^ (x >> 16)
    x = (x * _MUL1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & _MASK32
    return x ^ (x >> 16)


def _mix32_(x: Tensor, scratch: Tensor) -> Tensor:
    """In-place ``_mix32`` for big [B, V] tensors; ``scratch`` (same shape) avoids
    allocating a fresh temporary for every shift."""
    torch.bitwise_right_shift(x, 16, out=scratch)
    x.bitwise_xor_(scratch)
    x.mul_(_MUL1).bitwise_and_(_MASK32)
    torch.bitwise_right_shift(x, 15, out=scratch)
    x.bitwise_xor_(scratch)
    x.mul_(_MUL2).bitwise_and_(_MASK32)
    torch.bitwise_right_shift(x, 16, out=scratch)
    return x.bitwise_xor_(scratch)


def _row_keys(seeds: Tensor, steps: Tensor) -> Tensor:
    """[B] int64 seeds/steps -> [B] int64 32-bit keys. Arithmetic shift + mask gives the
    high word of negative seeds as well."""
    seed_lo = seeds & _MASK32
    seed_hi = (seeds >> 32) & _MASK32
    key = _mix32(seed_hi ^ _SEED_SALT)
    key = _mix32(key ^ seed_lo)
    return _mix32(key ^ (steps & _MASK32))


_TOKEN_HASH_CACHE: dict[tuple[int, str], Tensor] = {}


def _token_hash(vocab_size: int, device: torch.device) -> Tensor:
    """[V] int64 hash of each token index; depends only on the index, so it is cached."""
    cache_key = (vocab_size, str(device))
    cached = _TOKEN_HASH_CACHE.get(cache_key)
    if cached is None:
        cached = _ids_hash(torch.arange(vocab_size, dtype=torch.int64, device=device))
        _TOKEN_HASH_CACHE[cache_key] = cached
    return cached


def _ids_hash(token_ids: Tensor) -> Tensor:
    """The token hash of these ids (any shape, int64): ``_token_hash(V)[token_ids]`` for any
    V above them."""
    return _mix32(_mix32(token_ids) ^ _TOKEN_SALT)


def _exp_noise(token_hash: Tensor, keys: Tensor) -> Tensor:
    """Exp(1) noise for every (row, token). token_hash: [V] or [B, N] int64 hashes of the
    token indices involved; keys: [B] int64. Returns [B, N] float32, all finite and > 0."""
    kernel = _cpu_kernel() if token_hash.device.type == "cpu" else None
    if kernel is not None:
        # The uniforms in one C loop (integer ops, then an exact conversion: the same bits as
        # the torch ops below, which stream a dozen [B, N] int64 passes through memory).
        hashes, keys = token_hash.contiguous(), keys.contiguous()
        n = hashes.shape[-1]
        assert hashes.dim() == 1 or hashes.shape[0] == keys.shape[0], "a row of hashes per key, or one shared"
        noise = torch.empty(keys.shape[0], n, dtype=torch.float32)
        kernel.race_uniforms(hashes.data_ptr(), n, n if hashes.dim() == 2 else 0, keys.data_ptr(), keys.shape[0],
                             noise.data_ptr())  # fmt: skip
        return noise.log_().neg_()
    x = token_hash ^ keys[:, None]  # [B, N] fresh int64 tensor we own
    scratch = torch.empty_like(x)
    _mix32_(x, scratch)
    # Top 23 bits: (m + 0.5) / 2**23 is exact in float32 and at most 1 - 2**-24 < 1. With 24
    # bits the largest m rounded to U == 1.0, E == 0, and that token won (or NaN'd) the race.
    x.bitwise_right_shift_(9)
    noise = x.to(torch.float32)
    # U = (m + 0.5) / 2**23 in (0, 1); E = -log(U) in [6e-8, 16.6].
    return noise.add_(0.5).mul_(_INV_2_23).log_().neg_()


def _cpu_kernel() -> Any:
    """The C extension (its ``race_uniforms``), or None where it was not built."""
    from aserve.kernels.gguf_linear import kernel

    return kernel()


def uniform_noise(seeds: Tensor, steps: Tensor, token_ids: Tensor) -> Tensor:
    """The uniforms the sampler uses: ``U[b, j]`` for token ``token_ids[b, j]`` of a request
    with ``seeds[b]`` at ``steps[b]``. Exposed for tests and for debugging reproducibility.
    seeds/steps: [B] int64; token_ids: [B, N] int64 -> [B, N] float32 in (0, 1)."""
    x = _mix32(_ids_hash(token_ids) ^ _row_keys(seeds, steps)[:, None])
    return ((x >> 9).to(torch.float32) + 0.5) * _INV_2_23

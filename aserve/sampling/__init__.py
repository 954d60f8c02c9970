"""Token sampling: penalties, temperature, top-k/top-p/min-p and seeded draws on device."""

from __future__ import annotations

from aserve.sampling.sampler import (
    SampleOutput,
    SamplingBatch,
    SamplingParamsLike,
    apply_penalties,
    make_sampling_batch,
    sample,
    uniform_noise,
)

__all__ = [
    "SampleOutput",
    "SamplingBatch",
    "SamplingParamsLike",
    "apply_penalties",
    "make_sampling_batch",
    "sample",
    "uniform_noise",
]

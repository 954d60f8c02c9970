"""Token sampling: penalties, temperature, top-k/top-p/min-p and seeded draws on device."""

from __future__ import annotations

from aserve.sampling.batch import SamplingBatch, SamplingParamsLike, make_sampling_batch
from aserve.sampling.noise import uniform_noise
from aserve.sampling.sampler import SampleOutput, apply_penalties, sample

__all__ = [
    "SampleOutput",
    "SamplingBatch",
    "SamplingParamsLike",
    "apply_penalties",
    "make_sampling_batch",
    "sample",
    "uniform_noise",
]

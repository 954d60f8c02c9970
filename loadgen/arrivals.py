"""Arrival schedules, computed up front from the seed so identical runs send identically."""

from __future__ import annotations

import math

import numpy as np


def arrival_times(
    n: int, rate: float, burstiness: float = 1.0, seed: int = 0, *, process: str = "poisson"
) -> list[float]:
    """Send times (seconds from the start) of ``n`` requests at mean ``rate`` requests/s.

    * rate ``inf``: everything at t=0 (a burst).
    * ``constant``: evenly spaced, 1/rate apart.
    * ``poisson``: exponential gaps (gamma with shape 1).
    * ``gamma``: gamma gaps with shape ``burstiness`` and the same mean 1/rate; below 1 is
      burstier than Poisson, above 1 more regular.
    """
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError("rate must be > 0 (use inf for a burst)")
    if process == "constant":
        return [i / rate for i in range(n)]
    shape = 1.0 if process == "poisson" else burstiness
    if shape <= 0:
        raise ValueError("burstiness must be > 0")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
    gaps[0] = 0.0  # the first request goes at once; the run's clock starts with it
    return [float(t) for t in np.cumsum(gaps)]


def count_for_duration(duration: float, rate: float) -> int:
    """How many requests to schedule for a ``duration``-second open-loop run (surplus is cut)."""
    if math.isinf(rate):
        raise ValueError("a duration needs a finite --rate or closed-loop --users")
    return max(1, math.ceil(duration * rate * 1.5) + 10)

"""Summary statistics and the bootstrap, on plain lists (numpy does the arithmetic)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def describe(values: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean, std, min, max and the percentiles (linear interpolation); None when empty."""
    out: dict[str, float | int | None] = {"count": len(values)}
    keys = ["mean", "std", "min", "max"] + [pct_key(p) for p in PERCENTILES]
    if not values:
        out.update(dict.fromkeys(keys))
        return out
    a = np.asarray(values, dtype=float)
    out.update(mean=float(a.mean()), std=float(a.std()), min=float(a.min()), max=float(a.max()))
    for p, v in zip(PERCENTILES, np.percentile(a, PERCENTILES)):
        out[pct_key(p)] = float(v)
    return out


def pct_key(p: float) -> str:
    return f"p{p:g}".replace(".", "_")


def bootstrap_ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    stat: Callable[[np.ndarray], float] = lambda x: float(np.mean(x)),
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float | None, float | None, float | None]:
    """stat(b)/stat(a) and a percentile bootstrap CI, resampling each side independently.

    With one value on a side there is nothing to resample: the CI is None, the ratio is not.
    """
    if not a or not b:
        return None, None, None
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    base = stat(xa)
    ratio = stat(xb) / base if base else None
    if len(xa) < 2 or len(xb) < 2:
        return ratio, None, None
    rng = np.random.default_rng(seed)
    ra = xa[rng.integers(0, len(xa), (n_boot, len(xa)))]
    rb = xb[rng.integers(0, len(xb), (n_boot, len(xb)))]
    sa = np.array([stat(r) for r in ra])
    sb = np.array([stat(r) for r in rb])
    keep = sa != 0
    if not keep.any():
        return ratio, None, None
    ratios = sb[keep] / sa[keep]
    lo, hi = np.percentile(ratios, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return ratio, float(lo), float(hi)

"""The server's own view of a run: counters before and after, as deltas.

aserve exposes device busy time, device idle gap between steps and host plan / launch /
commit time as Prometheus counters (``aserve/server/metrics.py``); the in-process engine
gives the same numbers through ``engine.stats()``. Both end up under the same keys here.
"""

from __future__ import annotations

# Our key -> the Prometheus family (exposed with a ``_total`` suffix) and the EngineStats field.
COUNTERS = {
    "device_busy_s": ("aserve_device_busy_seconds", "device_busy_s"),
    "device_gap_s": ("aserve_device_gap_seconds", "device_gap_s"),
    "host_plan_s": ("aserve_host_plan_seconds", "host_plan_s"),
    "host_launch_s": ("aserve_host_launch_seconds", "host_launch_s"),
    "host_commit_s": ("aserve_host_commit_seconds", "host_commit_s"),
    "engine_steps": ("aserve_engine_steps", "num_steps"),
    "output_tokens": ("aserve_output_tokens", "output_tokens"),
    "cache_hit_tokens": ("aserve_prefix_cache_hit_tokens", "cache_hit_tokens"),
    "cache_queried_tokens": ("aserve_prefix_cache_queried_tokens", "cache_queried_tokens"),
}


def parse_prometheus(text: str) -> dict[str, float]:
    """Our keys from a Prometheus text page (unlabelled samples only); absent ones are left out."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "{" in line:
            continue
        name, _, value = line.partition(" ")
        try:
            samples[name] = float(value.split()[0])
        except (ValueError, IndexError):
            continue
    out = {}
    for key, (family, _) in COUNTERS.items():
        for name in (family + "_total", family):
            if name in samples:
                out[key] = samples[name]
                break
    return out


def from_engine_stats(stats: object) -> dict[str, float]:
    return {key: float(getattr(stats, field)) for key, (_, field) in COUNTERS.items() if hasattr(stats, field)}


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    d = {k: after[k] - before[k] for k in after if k in before}
    busy, gap = d.get("device_busy_s"), d.get("device_gap_s")
    if busy is not None and gap is not None and busy + gap > 0:
        d["device_gap_fraction"] = gap / (busy + gap)  # share of device time lost between steps
    hits, queried = d.get("cache_hit_tokens"), d.get("cache_queried_tokens")
    if hits is not None and queried:
        d["cache_hit_rate"] = hits / queried  # prompt tokens served from the prefix cache, this run
    steps = d.get("engine_steps")
    if steps and gap is not None:
        d["mean_gap_per_step_ms"] = gap / steps * 1000
    return d

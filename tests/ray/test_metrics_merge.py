"""The merged /metrics page of the Ray app, from two real aserve metrics pages (no Ray needed)."""

from __future__ import annotations

import dataclasses

from aserve.ray.metrics import aggregate
from aserve.server.metrics import ServerMetrics
from aserve.stats import EngineStats
from loadgen.server_view import parse_prometheus


def _stats(**values: float) -> EngineStats:
    zero = {f.name: 0 for f in dataclasses.fields(EngineStats)}
    zero.update(kv_ledger_balanced=True, median_device_gap_s=None, median_decode_gap_s=None)
    return EngineStats(**{**zero, **values})  # type: ignore[arg-type]


def _page(stats: EngineStats, outputs: int) -> str:
    m = ServerMetrics(lambda: stats)
    m.output_tokens.inc(outputs)
    return m.render().decode()


def test_pages_are_summed_labelled_and_ratios_recomputed() -> None:
    a = _stats(running=3, kv_used_tokens=100, kv_total_tokens=1000, cache_hit_tokens=30, cache_queried_tokens=100)
    b = _stats(running=1, kv_used_tokens=300, kv_total_tokens=1000, cache_hit_tokens=10, cache_queried_tokens=300)
    text = aggregate([("r1", _page(a, 7)), ("r2", _page(b, 5))])
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert float(lines["aserve_requests_running"]) == 4
    assert float(lines['aserve_requests_running{replica="r1"}']) == 3
    assert float(lines['aserve_requests_running{replica="r2"}']) == 1
    assert float(lines["aserve_kv_usage_ratio"]) == 400 / 2000  # not 0.1 + 0.3
    assert float(lines["aserve_prefix_cache_hit_rate"]) == 40 / 400
    assert float(lines["aserve_replicas"]) == 2
    assert not any("_created" in k for k in lines)
    # loadgen reads the cluster's totals under the names a single server uses.
    view = parse_prometheus(text)
    assert view["output_tokens"] == 12 and view["cache_hit_tokens"] == 40 and view["cache_queried_tokens"] == 400

"""Prometheus metrics: one registry per app, plus a collector that reads ``engine.stats()``.

Request-side numbers (latencies, outcomes) are observed by the routes as responses are
produced; engine-side numbers (queue sizes, KV, scheduler timings) are read at scrape time,
so they can never drift from the engine's own ledger.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from aserve.stats import EngineStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        st = self._stats()
        if st is None:  # still loading or already stopped: nothing to report
            return
        gauges = {
            "aserve_requests_running": ("Sequences being generated", st.running),
            "aserve_requests_waiting": ("Sequences waiting to be scheduled", st.waiting),
            "aserve_kv_used_tokens": ("KV cache tokens in use", st.kv_used_tokens),
            "aserve_kv_free_tokens": ("KV cache tokens free", st.kv_free_tokens),
            "aserve_kv_total_tokens": ("KV cache capacity in tokens", st.kv_total_tokens),
            "aserve_kv_usage_ratio": (
                "Fraction of the KV cache in use",
                st.kv_used_tokens / st.kv_total_tokens if st.kv_total_tokens else 0.0,
            ),
            "aserve_pipeline_in_use": ("Scheduler pipeline slots in use", st.pipeline_in_use),
            "aserve_prefix_cached_tokens": ("Tokens held by the prefix cache", st.cached_tokens),
            "aserve_prefix_cache_hit_rate": (
                "Prompt tokens served from the prefix cache / admitted",
                st.cache_hit_rate,
            ),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "aserve_device_busy_seconds": ("Device time spent running steps", st.device_busy_s),
            "aserve_device_gap_seconds": ("Device idle time between back-to-back steps", st.device_gap_s),
            "aserve_host_plan_seconds": ("Host time planning steps", st.host_plan_s),
            "aserve_host_launch_seconds": ("Host time launching steps", st.host_launch_s),
            "aserve_host_commit_seconds": ("Host time committing step results", st.host_commit_s),
            "aserve_engine_steps": ("Scheduler steps run", st.num_steps),
            "aserve_engine_retractions": ("Requests retracted for lack of KV", st.num_retractions),
            "aserve_prefix_cache_hit_tokens": ("Prompt tokens served from the prefix cache", st.cache_hit_tokens),
            "aserve_prefix_cache_queried_tokens": ("Prompt tokens of admitted requests", st.cache_queried_tokens),
            "aserve_prefix_cache_evicted_tokens": ("Tokens evicted from the prefix cache", st.cache_evicted_tokens),
            "aserve_prefill_computed_tokens": ("Prompt tokens actually computed", st.prefill_tokens_computed),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)


class ServerMetrics:
    def __init__(self, stats: Callable[[], EngineStats | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "aserve_requests", "Requests by endpoint and outcome", ["endpoint", "outcome"], registry=r
        )
        self.prompt_tokens = Counter("aserve_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.output_tokens = Counter("aserve_output_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "aserve_time_to_first_token_seconds", "Time to first token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "aserve_time_per_output_token_seconds",
            "Mean time per output token after the first",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "aserve_inter_token_latency_seconds", "Time between streamed chunks", buckets=_TOKEN_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "aserve_e2e_request_latency_seconds", "End-to-end request latency", buckets=_LATENCY_BUCKETS, registry=r
        )
        self._engine = _EngineCollector(stats)
        r.register(self._engine)

    def render(self) -> bytes:
        """The exposition text. With front ends in several processes (``PROMETHEUS_MULTIPROC_DIR``
        set by ``aserve serve --api-workers N``), every front end's request metrics, summed from
        prometheus-client's per-process files, plus the engine core's gauges and counters from
        its latest heartbeat: one view whichever front end answers."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)
            merged.register(self._engine)
            return generate_latest(merged)
        return generate_latest(self.registry)

    def timer(self, endpoint: str) -> RequestTimer:
        return RequestTimer(self, endpoint)


class RequestTimer:
    """Latencies of one request, observed as its tokens arrive."""

    def __init__(self, metrics: ServerMetrics, endpoint: str) -> None:
        self._m = metrics
        self._endpoint = endpoint
        self._start = time.perf_counter()
        self._first: float | None = None
        self._last: float | None = None
        self.tokens = 0
        self._done = False

    def on_tokens(self, count: int, *, streamed: bool) -> None:
        if count <= 0:
            return
        now = time.perf_counter()
        if self._first is None:
            self._first = now
            self._m.ttft.observe(now - self._start)
        elif streamed and self._last is not None:
            self._m.itl.observe(now - self._last)
        self._last = now
        self.tokens += count
        self._m.output_tokens.inc(count)

    def observe_result(self, metrics: dict[str, float], completion_tokens: int) -> None:
        """A non-streamed request: the engine measured its first-token time for us."""
        if "ttft_s" in metrics:
            self._first = self._start + metrics["ttft_s"]
            self._m.ttft.observe(metrics["ttft_s"])
        self.tokens = completion_tokens
        self._m.output_tokens.inc(completion_tokens)

    def admitted(self, prompt_tokens: int) -> None:
        self._m.prompt_tokens.inc(prompt_tokens)

    def finish(self, outcome: str) -> None:
        if self._done:  # a stream can be closed after it already reported
            return
        self._done = True
        now = time.perf_counter()
        self._m.requests.labels(self._endpoint, outcome).inc()
        if outcome != "success":
            return
        self._m.e2e.observe(now - self._start)
        if self._first is not None and self.tokens > 1:
            self._m.tpot.observe((now - self._first) / (self.tokens - 1))

"""The server's state at one instant, for the soak timeline: memory, fds, KV, queue.

Memory and file descriptors come from ``/proc`` when the server's pid is known (summed over
its process tree), else from prometheus-client's ``process_resident_memory_bytes`` and
``process_open_fds`` if the server exports them. KV use and the queue come from ``/metrics``:
aserve's ``aserve_kv_used_tokens`` (tokens held by requests; the prefix cache's pages are not
counted), ``aserve_requests_running`` and ``aserve_requests_waiting``.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadgen.procstat import sample_tree

QUEUE = {"running": "aserve_requests_running", "waiting": "aserve_requests_waiting"}
KV_TOTAL = "aserve_kv_total_tokens"
KV_CACHED = "aserve_prefix_cached_tokens"  # pages the prefix cache keeps after their requests end
PROCESS = {"rss_bytes": "process_resident_memory_bytes", "fds": "process_open_fds"}


def parse_metrics(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """(unlabelled samples by name, ``aserve_requests_total`` summed by outcome)."""
    plain: dict[str, float] = {}
    outcomes: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.labels:
                plain[s.name] = float(s.value)
            elif s.name == "aserve_requests_total" and "outcome" in s.labels:
                key = s.labels["outcome"]
                outcomes[key] = outcomes.get(key, 0.0) + float(s.value)
    return plain, outcomes


class ServerProbe:
    def __init__(self, base_url: str, *, pid: int | None, api_key: str | None, kv_metric: str) -> None:
        self.metrics_url = base_url.rstrip("/") + "/metrics"
        self.pid = pid
        self.kv_metric = kv_metric
        # Its own client: a scrape never waits behind the load's connections.
        self.client = httpx.AsyncClient(headers={"Authorization": f"Bearer {api_key}"} if api_key else {}, timeout=10.0)
        self.outcomes: dict[str, float] = {}  # the server's request outcomes at the last scrape

    async def aclose(self) -> None:
        await self.client.aclose()

    async def sample(self) -> dict[str, Any]:
        """One sample; fields the server does not give are None, never a guess."""
        out: dict[str, Any] = dict.fromkeys(
            ("rss_bytes", "fds", "threads", "procs", "kv_used", "kv_cached", "kv_total", "running", "waiting")
        )
        out["server_alive"] = True
        if self.pid is not None:
            tree = await anyio.to_thread.run_sync(sample_tree, self.pid)
            if tree is None:
                out["server_alive"] = False
            else:
                out.update(rss_bytes=tree.rss_bytes, fds=tree.fds, threads=tree.threads, procs=tree.procs)
                out["fd_kinds"] = tree.fd_kinds
        try:
            r = await self.client.get(self.metrics_url)
            r.raise_for_status()
            plain, self.outcomes = parse_metrics(r.text)
        except (httpx.HTTPError, ValueError) as exc:
            out["metrics_error"] = f"{type(exc).__name__}: {exc}"
            return out
        out["kv_used"] = plain.get(self.kv_metric)
        out["kv_cached"] = plain.get(KV_CACHED)
        out["kv_total"] = plain.get(KV_TOTAL)
        for key, name in QUEUE.items():
            out[key] = plain.get(name)
        if self.pid is None:
            for key, name in PROCESS.items():
                out[key] = plain.get(name)
        return out

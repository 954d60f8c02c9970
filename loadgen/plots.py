"""PNG plots (matplotlib, Agg): one function per picture, each taking one or more runs.

A run here is ``(label, records, summary)``; several runs are overlaid where that makes sense.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and in tests
import matplotlib.pyplot as plt
import numpy as np

from loadgen.records import RequestRecord

Run = tuple[str, Sequence[RequestRecord], dict[str, Any]]


def _values(records: Sequence[RequestRecord], metric: str) -> list[float]:
    ok = [r for r in records if r.ok]
    if metric == "itl":
        return [x for r in ok for x in r.itls]
    return [float(v) for r in ok if (v := getattr(r, metric)) is not None]


def cdfs(runs: Sequence[Run], path: Path) -> Path:
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, metric in zip(axes.flat, ("ttft", "tpot", "itl", "e2e")):
        for label, records, _ in runs:
            v = np.sort(np.asarray(_values(records, metric)) * 1000)
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label)
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("fraction of requests" if metric != "itl" else "fraction of gaps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Latency CDFs")
    return _save(fig, path)


def over_time(runs: Sequence[Run], path: Path) -> Path:
    fig, (a, b) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for label, _, s in runs:
        series = s["series"]
        rate = series["output_tok_per_s_1s"]
        start = series.get("t0", 0.0)
        if rate:  # repeat the last value so the last bucket is drawn as a step, not a point
            a.step(start + np.arange(len(rate) + 1), [*rate, rate[-1]], where="post", label=label)
        b.step(series["in_flight_t"], series["in_flight"], where="post", label=label)
    a.set_ylabel("output tok/s (1 s buckets)")
    b.set_ylabel("requests in flight")
    b.set_xlabel("time (s)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def timeline(records: Sequence[RequestRecord], path: Path, limit: int = 200) -> Path:
    """One row per request: queued (scheduled→send), waiting for the first token, streaming."""
    recs = [r for r in records if r.send_s is not None][:limit]
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.12 * len(recs) + 1)))
    for y, r in enumerate(recs):
        send = float(r.send_s or 0.0)
        sched = r.scheduled_s if r.scheduled_s is not None else send
        first = r.chunk_s[0] if r.chunk_s else None
        end = r.done_s if r.done_s is not None else send
        ax.hlines(y, sched, send, color="0.7", lw=3)
        ax.hlines(y, send, first if first is not None else end, color="tab:orange", lw=3)
        if first is not None:
            ax.hlines(y, first, end, color="tab:blue" if r.ok else "tab:red", lw=3)
        if r.chunk_s:
            ax.plot(r.chunk_s, [y] * len(r.chunk_s), "|", color="k", ms=4)
        if not r.ok:
            ax.plot([end], [y], "x", color="tab:red")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("request")
    ax.set_title("Per-request timeline: grey queued, orange to first token, blue streaming, red failed")
    return _save(fig, path)


def itl_by_position(runs: Sequence[Run], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 5))
    for label, records, _ in runs:
        by_pos: dict[int, list[float]] = defaultdict(list)
        for r in records:
            if r.ok:
                for k, gap in enumerate(r.itls, start=1):
                    by_pos[k].append(gap * 1000)
        if not by_pos:
            continue
        pos = sorted(by_pos)
        ax.plot(pos, [np.median(by_pos[p]) for p in pos], label=f"{label} median")
        ax.plot(pos, [np.percentile(by_pos[p], 99) for p in pos], "--", label=f"{label} p99")
    ax.set_xlabel("chunk position in the stream (1 = gap after the first chunk)")
    ax.set_ylabel("ITL (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def sweep_tradeoff(points: Sequence[tuple[str, dict[str, Any]]], path: Path) -> Path:
    """Output tok/s against p99 TPOT, one point per sweep step (labelled by its setting)."""
    fig, ax = plt.subplots(figsize=(8, 6))
    xs = [_ms_or_nan(s["latency_s"]["tpot"]["p99"]) for _, s in points]
    ys = [s["throughput"]["output_tok_per_s"] for _, s in points]
    ax.plot(xs, ys, "o-")
    for (label, _), x, y in zip(points, xs, ys):
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("p99 TPOT (ms)")
    ax.set_ylabel("output tok/s")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def goodput_vs_rate(points: Sequence[tuple[float, dict[str, Any]]], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 6))
    rates = [r for r, _ in points]
    ax.plot(rates, [s["goodput"]["requests_per_s"] for _, s in points], "o-", label="goodput (req/s)")
    ax.plot(rates, [s["throughput"]["requests_per_s"] for _, s in points], "s--", label="throughput (req/s)")
    ax.set_xlabel("offered rate (req/s) or concurrency")
    ax.set_ylabel("requests/s")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def soak_timeline(timeline: dict[str, Any], path: Path) -> Path:
    """A soak over time: server RSS, open fds, KV in use, per-window latency and throughput.

    The warm-up and the drain are shaded; dotted lines split the rest into the quarters that
    the memory check compares.
    """
    samples = timeline["samples"]
    spec = timeline["spec"]
    t = np.array([s["t"] for s in samples])

    def col(key: str, scale: float = 1.0) -> np.ndarray:
        return np.array([np.nan if s.get(key) is None else float(s[key]) / scale for s in samples])

    def win(key: str, scale: float = 1.0) -> np.ndarray:
        # The idle start and end samples close windows of their own length, not the interval's: left out.
        return np.array(
            [
                np.nan
                if s["phase"] in ("start", "end") or s["window"].get(key) is None
                else float(s["window"][key]) * scale
                for s in samples
            ]
        )

    fig, axes = plt.subplots(5, 1, figsize=(11, 13), sharex=True)
    rss, fds, kv, lat, tput = axes
    mib = col("rss_bytes", 2**20)
    rss.plot(t, mib, ".-")
    rss.set_ylabel("server RSS (MiB)")
    rss.ticklabel_format(axis="y", useOffset=False, style="plain")
    if np.isfinite(mib).any():  # at least the allowed growth tall, so noise does not look like a slope
        lo, hi = float(np.nanmin(mib)), float(np.nanmax(mib))
        pad = max(0.0, spec["rss_growth_limit_mib"] - (hi - lo)) / 2 + 1.0
        rss.set_ylim(lo - pad, hi + pad)
    fds.plot(t, col("fds"), ".-", color="tab:green")
    fds.set_ylabel("server open fds")
    kv.plot(t, col("kv_used"), ".-", color="tab:purple", label="KV used by requests")
    kv.plot(t, col("kv_cached"), "-", color="tab:cyan", lw=1, label="prefix cache")
    kv.set_ylabel("KV (tokens)")
    kv.legend(fontsize=8, loc="upper left")
    queue = kv.twinx()
    queue.plot(t, col("running"), "--", color="tab:orange", lw=1, label="running")
    queue.plot(t, col("waiting"), ":", color="tab:red", lw=1, label="waiting")
    queue.plot(t, col("in_flight"), "-", color="0.6", lw=1, label="in flight (client)")
    queue.set_ylabel("requests")
    queue.legend(fontsize=8, loc="upper right")
    for key, style in (("ttft_p50_s", ".-"), ("ttft_p99_s", "x--"), ("e2e_p50_s", ".-"), ("e2e_p99_s", "x--")):
        # markers: on a slow server most windows end no request, and a lone value draws no line
        lat.plot(t, win(key, 1000), style, ms=4, label=key.replace("_s", "").replace("_", " "))
    lat.set_yscale("log")
    lat.set_ylabel("latency per window (ms)")
    lat.legend(fontsize=8, ncol=4)
    tput.plot(t, win("output_tok_per_s"), ".-", label="completed output tok/s")
    tput.set_ylabel("output tok/s")
    counts = tput.twinx()
    counts.bar(t, win("aborted"), width=spec["sample_interval"] * 0.4, color="tab:orange", alpha=0.5, label="aborted")
    counts.bar(t, win("errors"), width=spec["sample_interval"] * 0.4, color="tab:red", label="errors")
    counts.set_ylabel("requests per window")
    counts.legend(fontsize=8, loc="upper right")
    tput.set_xlabel("time since the load started (s)")
    quarter = (spec["duration"] - spec["warmup_s"]) / 4
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.axvspan(0, spec["warmup_s"], color="0.9", zorder=0)
        ax.axvspan(spec["duration"], max(float(t.max()), spec["duration"]), color="0.9", zorder=0)
        for k in range(1, 4):
            ax.axvline(spec["warmup_s"] + k * quarter, color="0.5", ls=":", lw=0.8)
    v = timeline.get("verdict", {})
    fig.suptitle(
        f"soak {timeline['run']['label']}: {spec['concurrency']} streams, {spec['duration']:g} s — "
        f"{'PASS' if v.get('passed') else 'FAIL'}"
    )
    return _save(fig, path)


def all_run_plots(runs: Sequence[Run], out_dir: Path, prefix: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        cdfs(runs, out_dir / f"{prefix}cdf.png"),
        over_time(runs, out_dir / f"{prefix}over_time.png"),
        itl_by_position(runs, out_dir / f"{prefix}itl_by_position.png"),
        timeline(runs[-1][1], out_dir / f"{prefix}timeline.png"),
    ]
    return paths


def _ms_or_nan(x: Any) -> float:
    return float("nan") if x is None else float(x) * 1000


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

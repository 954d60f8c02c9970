"""The metrics of a run, from its records. Every formula is written out in docs/loadgen.md."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.records import RequestRecord
from loadgen.stats import describe

LATENCIES = ("ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True)
class SLO:
    ttft: float | None = None  # seconds
    tpot: float | None = None
    e2e: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> SLO:
        """``ttft=0.5,tpot=50ms,e2e=2s``: seconds unless suffixed ``ms``."""
        if not text:
            return cls()
        values: dict[str, float] = {}
        for part in text.split(","):
            key, _, raw = part.partition("=")
            key, raw = key.strip(), raw.strip()
            if key not in ("ttft", "tpot", "e2e"):
                raise ValueError(f"unknown SLO {key!r}; use ttft, tpot, e2e")
            values[key] = float(raw[:-2]) / 1000 if raw.endswith("ms") else float(raw.removesuffix("s"))
        return cls(**values)

    def met(self, r: RequestRecord) -> bool:
        if not r.ok:
            return False  # a failed request never meets an SLO
        for limit, value in ((self.ttft, r.ttft), (self.tpot, r.tpot), (self.e2e, r.e2e)):
            # A one-token answer has no TPOT, which cannot break a TPOT limit.
            no_tpot = limit is self.tpot and value is None and r.output_tokens <= 1
            if limit is not None and (value is None or value > limit) and not no_tpot:
                return False
        return True

    def as_dict(self) -> dict[str, float | None]:
        return {"ttft": self.ttft, "tpot": self.tpot, "e2e": self.e2e}


def bucket_rate(
    times: Sequence[float], weights: Sequence[float], start: float, end: float, width: float = 1.0
) -> list[float]:
    """Sum of ``weights`` per ``width``-second bucket from ``start`` to ``end``, divided by width."""
    n = max(1, math.ceil((end - start) / width))
    out = np.zeros(n)
    for t, w in zip(times, weights):
        k = int((t - start) // width)
        if 0 <= k < n:
            out[k] += w
        elif k == n:  # the very last instant belongs to the last bucket
            out[-1] += w
    return [float(x) / width for x in out]


def peak_rate(times: Sequence[float], weights: Sequence[float], duration: float, width: float = 1.0) -> float:
    """The most ``weights`` any ``width``-second window of the run holds, per second (a window
    that starts at a chunk holds the most of those that contain it). Fixed buckets would miss a
    burst that straddles two of them, and split a short run's last one. A run shorter than
    ``width`` has no such window: its mean rate."""
    if duration < width or not times:
        return sum(weights) / duration if duration > 0 else 0.0
    pairs = sorted(zip(times, weights, strict=True))
    best, held, j = 0.0, 0.0, 0
    for t, w in pairs:  # the window [t0, t0 + width) for each chunk time t0, in order
        held += w
        while pairs[j][0] <= t - width:
            held -= pairs[j][1]
            j += 1
        best = max(best, held)
    return best / width


def in_flight_series(records: Sequence[RequestRecord]) -> tuple[list[float], list[int]]:
    """Step function of requests in flight: +1 at send, −1 at done (or at the run's end if never)."""
    events: list[tuple[float, int]] = []
    for r in records:
        if r.send_s is None:
            continue
        events.append((r.send_s, +1))
        if r.done_s is not None:
            events.append((r.done_s, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # a completion at the same instant goes first
    times, level, cur = [], [], 0
    for t, d in events:
        cur += d
        times.append(t)
        level.append(cur)
    return times, level


def time_weighted_mean(times: Sequence[float], levels: Sequence[int], end: float) -> float:
    if not times:
        return 0.0
    area = sum(lv * (t1 - t0) for t0, t1, lv in zip(times, [*times[1:], end], levels))
    span = end - times[0]
    return area / span if span > 0 else float(levels[-1])


def summarize(
    records: Sequence[RequestRecord], slo: SLO, *, last_send_s: float | None = None, expect_exact: bool = True
) -> dict[str, Any]:
    """Everything the report shows, as plain JSON-able values."""
    sent = [r for r in records if r.send_s is not None]
    ok = [r for r in sent if r.ok]
    start = min((r.send_s for r in sent if r.send_s is not None), default=0.0)
    end = max((r.done_s for r in sent if r.done_s is not None), default=start)
    duration = max(end - start, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.input_tokens for r in ok)
    chunk_t = [t for r in ok for t in r.chunk_s]
    chunk_n = [float(n) for r in ok for n in r.chunk_tokens]
    per_sec = bucket_rate(chunk_t, chunk_n, start, end) if ok else []
    times, levels = in_flight_series(sent)
    good = [r for r in sent if slo.met(r)]
    lat = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "itl": [x for r in ok for x in r.itls],
        "e2e": [r.e2e for r in ok if r.e2e is not None],
    }
    summary: dict[str, Any] = {
        "requests": {
            "sent": len(sent),
            "completed": len(ok),
            "failed": sum(1 for r in sent if r.error_type is not None),
            # Sent and never ended (a run timeout); those never sent (still waiting for a
            # concurrency slot when the run ended) are counted apart, so sent = completed +
            # failed + unfinished.
            "unfinished": [r.index for r in sent if not r.finished],
            "not_sent": len(records) - len(sent),
        },
        "duration_s": duration,
        "throughput": {
            "requests_per_s": len(ok) / duration,
            "input_tok_per_s": in_tokens / duration,
            "output_tok_per_s": out_tokens / duration,
            "total_tok_per_s": (in_tokens + out_tokens) / duration,
            "peak_output_tok_per_s": peak_rate(chunk_t, chunk_n, duration),
        },
        "tokens": {"input": in_tokens, "output": out_tokens},
        "latency_s": {k: describe([float(v) for v in vals]) for k, vals in lat.items()},
        "tokens_per_chunk": describe(chunk_n),
        "concurrency": {
            "max_in_flight": max(levels, default=0),
            "mean_in_flight": time_weighted_mean(times, levels, end),
        },
        "goodput": {
            "slo": slo.as_dict(),
            "requests_per_s": len(good) / duration,
            "fraction": len(good) / len(sent) if sent else 0.0,
            "output_tok_per_s": sum(r.output_tokens for r in good) / duration,
        },
        "failures": failures(records),
        "token_check": token_check(ok, expect_exact),
        "series": {"t0": start, "output_tok_per_s_1s": per_sec, "in_flight_t": times, "in_flight": levels},
    }
    if last_send_s is not None:
        summary["steady_state"] = steady_state(ok, start, last_send_s)
    return summary


STEADY_MIN_S = 1.0  # a shorter sending window says nothing about a steady state


def steady_state(ok: Sequence[RequestRecord], start: float, last_send: float) -> dict[str, Any]:
    """The window from the first send to the last send: load is being added throughout, unlike
    the drain after it. Throughput counts the tokens that arrived inside the window."""
    span = last_send - start
    if span < STEADY_MIN_S:  # a burst (rate inf) sends everything at once: no window to speak of
        return {"start_s": start, "end_s": last_send, "output_tok_per_s": None, "completed": 0}
    toks = sum(n for r in ok for t, n in zip(r.chunk_s, r.chunk_tokens) if start <= t <= last_send)
    done = sum(1 for r in ok if r.done_s is not None and r.done_s <= last_send)
    return {"start_s": start, "end_s": last_send, "output_tok_per_s": toks / span, "completed": done}


def failures(records: Sequence[RequestRecord]) -> dict[str, Any]:
    by_type: Counter[str] = Counter()
    by_status: Counter[str] = Counter()
    first: dict[str, str] = {}
    for r in records:
        if r.error_type is None:
            continue
        by_type[r.error_type] += 1
        if r.status is not None and r.status != 200:
            by_status[str(r.status)] += 1
        key = f"{r.error_type}:{r.status}" if r.status and r.status != 200 else r.error_type
        first.setdefault(key, r.error or "")
    return {"by_type": dict(by_type), "by_status": dict(by_status), "first_messages": first}


def token_check(ok: Sequence[RequestRecord], expect_exact: bool) -> dict[str, Any]:
    """Server usage vs tokens we counted, and output length vs what we asked for."""
    usage_mismatch = [
        r.index for r in ok if r.usage_completion_tokens is not None and r.counted_tokens != r.usage_completion_tokens
    ]
    length_mismatch = [r.index for r in ok if r.output_tokens != r.max_tokens] if expect_exact else []
    prompt_mismatch = [
        r.index
        for r in ok
        if r.usage_prompt_tokens is not None and r.prompt_tokens and r.usage_prompt_tokens != r.prompt_tokens
    ]
    sources = Counter(r.count_source for r in ok)
    return {
        "usage_reported": sum(1 for r in ok if r.usage_completion_tokens is not None),
        "count_sources": dict(sources),
        "usage_vs_counted_mismatch": usage_mismatch,
        "output_len_vs_asked_mismatch": length_mismatch,
        "prompt_len_mismatch": prompt_mismatch,
    }

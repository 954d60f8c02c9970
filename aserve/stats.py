"""The scheduler's own truth: per-step device and host times, and an optional trace.

Device busy time is measured between events recorded around the forward on the device
stream; the idle gap is the time between the end of step n-1's device work and the start
of step n's. On CPU the "device" is the worker thread and the events carry its clock; on
CUDA they are timing events read after the step's copy completed.
"""

from __future__ import annotations

import bisect
import json
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StepRecord:
    index: int
    num_seqs: int
    num_tokens: int
    num_decodes: int
    depth_in_use: int
    device_busy_s: float
    device_gap_s: float | None  # None for the first step after an idle period
    plan_s: float
    launch_s: float
    commit_s: float


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    kv_total_tokens: int
    kv_free_tokens: int
    kv_used_tokens: int
    kv_ledger_balanced: bool
    rows_total: int
    rows_free: int
    pipeline_depth: int
    pipeline_in_use: int
    num_steps: int
    num_retractions: int
    requests_finished: int
    requests_aborted: int
    prompt_tokens: int
    output_tokens: int
    device_busy_s: float
    device_gap_s: float
    host_plan_s: float
    host_launch_s: float
    host_commit_s: float
    median_device_gap_s: float | None  # over the latest MEDIAN_WINDOW steps with a gap
    median_decode_gap_s: float | None  # over the latest MEDIAN_WINDOW decode-only steps with a gap
    cache_hit_tokens: int = 0  # prompt tokens served from the prefix cache
    cache_queried_tokens: int = 0  # prompt tokens of admitted requests (hit rate denominator)
    cached_tokens: int = 0  # tokens held by the prefix cache now
    cache_evicted_tokens: int = 0
    prefill_tokens_computed: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hit_tokens / self.cache_queried_tokens if self.cache_queried_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The median gaps are over this many of the latest steps that have a gap (since the last reset).
MEDIAN_WINDOW = 8192


class WindowMedian:
    """The exact median of the last ``window`` values added, kept sorted as they come (an
    insort and, once full, a removal: ~2 us a value at 8k), so asking costs nothing. Asked
    by every heartbeat to the front ends and every scrape: a median taken over 100,000 kept
    records cost 36 ms of the core's loop each time."""

    def __init__(self, window: int = MEDIAN_WINDOW) -> None:
        self.window = window
        self._sorted: list[float] = []
        self._order: deque[float] = deque()

    def add(self, value: float) -> None:
        bisect.insort(self._sorted, value)
        self._order.append(value)
        if len(self._order) > self.window:
            del self._sorted[bisect.bisect_left(self._sorted, self._order.popleft())]

    def value(self) -> float | None:
        s, n = self._sorted, len(self._sorted)
        if n == 0:
            return None
        mid = n // 2
        return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2  # as statistics.median


class StepStats:
    """Totals since start plus the most recent step records."""

    def __init__(self, keep: int = 100_000) -> None:
        self.records: deque[StepRecord] = deque(maxlen=keep)
        self._gaps = WindowMedian()
        self._decode_gaps = WindowMedian()
        self.num_steps = 0
        self.device_busy_s = 0.0
        self.device_gap_s = 0.0
        self.plan_s = 0.0
        self.launch_s = 0.0
        self.commit_s = 0.0

    def add(self, rec: StepRecord) -> None:
        self.records.append(rec)
        self.num_steps += 1
        self.device_busy_s += rec.device_busy_s
        self.device_gap_s += rec.device_gap_s or 0.0
        self.plan_s += rec.plan_s
        self.launch_s += rec.launch_s
        self.commit_s += rec.commit_s
        if rec.device_gap_s is not None:
            self._gaps.add(rec.device_gap_s)
            if rec.num_decodes == rec.num_seqs:
                self._decode_gaps.add(rec.device_gap_s)

    def median_gap(self, decode_only: bool = False) -> float | None:
        """The median idle gap before a step (``decode_only``: before a step of decodes only),
        over the latest ``MEDIAN_WINDOW`` such steps."""
        return (self._decode_gaps if decode_only else self._gaps).value()

    def reset(self) -> None:
        self.__init__(self.records.maxlen or 100_000)  # type: ignore[misc]


class TraceWriter:
    """Chrome trace-event JSON (opens in Perfetto): host phases, device spans, each step's
    token states (planned, in-flight, materialized, committed) and request states."""

    HOST, DEVICE, REQUESTS = 1, 2, 3

    def __init__(self, path: str | Path, t0: float) -> None:
        self.path = Path(path)
        self.t0 = t0
        self.events: list[dict[str, Any]] = [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}}
            for tid, name in ((self.HOST, "host (event loop)"), (self.DEVICE, "device"), (self.REQUESTS, "requests"))
        ]

    def _us(self, t: float) -> float:
        return (t - self.t0) * 1e6

    def span(self, name: str, tid: int, start: float, end: float, **args: Any) -> None:
        self.events.append(
            {
                "ph": "X",
                "name": name,
                "pid": 1,
                "tid": tid,
                "ts": self._us(start),
                "dur": max(0.0, (end - start) * 1e6),
                "args": args,
            }
        )

    def state_span(self, state: str, step: int, start: float, end: float, **args: Any) -> None:
        """One token state of one step, as an async slice: the states of consecutive steps
        overlap (that is the overlap), so each gets its own row in Perfetto."""
        common = {"cat": "token states", "name": state, "pid": 1, "id": step, "args": args}
        self.events.append({"ph": "b", "ts": self._us(start), **common})
        self.events.append({"ph": "e", "ts": self._us(max(start, end)), **common})

    def request_state(self, rid: str, state: str, t: float) -> None:
        self.events.append(
            {"ph": "i", "s": "t", "name": f"{rid}:{state}", "pid": 1, "tid": self.REQUESTS, "ts": self._us(t)}
        )

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"traceEvents": self.events, "displayTimeUnit": "ms"}))

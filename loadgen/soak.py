"""The soak: N requests always in flight for a duration, the server sampled every few seconds.

Order of a soak: a pre-warm round (one request per stream, aborts included, so whatever the
server allocates once on first use is in place), the idle ``start`` sample with the load's
connections closed, the load (closed loop: each of the N streams sends its next request as
soon as the last one ends, until the duration is up), the drain (every stream's last request
runs to its end), the load's connections closed, the settle (until KV use and the queue are 0
and the fds are back, or ``settle_timeout``), and the idle ``end`` sample.

Each sample carries the server's state (``soak_probe``) and the window since the previous
sample: requests ended in it, latency percentiles, completed output tokens per second. Every
task lives in the task group of ``_load``: the N streams and the sampler; the sampler is
cancelled once the streams are done.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import numpy as np
from rich.console import Console

from loadgen.soak_client import Mixer, Outcome, SoakClient
from loadgen.soak_probe import ServerProbe

ClientFactory = Callable[[], SoakClient]
PHASES = ("warmup", "q1", "q2", "q3", "q4", "drain")
MAX_ERRORS_KEPT = 50


@dataclass(frozen=True)
class SoakSpec:
    duration: float = 600.0  # seconds of load; the drain comes after
    concurrency: int = 32  # requests kept in flight
    warmup_s: float | None = None  # left out of the memory check; None: a fifth of the run, at most 60 s
    sample_interval: float = 5.0
    prewarm: bool = True
    settle_timeout: float = 30.0  # after the drain, how long KV and fds may take to come back
    fd_tolerance: int = 4  # the idle fds after may differ from before by this much
    rss_growth_limit_mib: float = 64.0  # last quarter's mean RSS minus the first quarter's
    seed: int = 0

    @property
    def warmup(self) -> float:
        return self.warmup_s if self.warmup_s is not None else min(60.0, self.duration / 5)

    def phase(self, t: float) -> str:
        if t < self.warmup:
            return "warmup"
        if t >= self.duration:
            return "drain"
        quarter = (self.duration - self.warmup) / 4
        return f"q{min(4, int((t - self.warmup) // quarter) + 1)}"

    def span(self, phase: str, load_end: float, stopped_at: float | None = None) -> float:
        """Seconds ``phase`` lasted in a run whose load ended at ``load_end``: a run stopped
        early (at ``stopped_at``) cuts the phase it was in short and leaves the later ones
        empty, and its drain begins there."""
        stop = min(self.duration, stopped_at if stopped_at is not None else self.duration)
        if phase == "drain":
            return max(0.0, load_end - stop)
        if phase == "warmup":
            start, end = 0.0, self.warmup
        else:
            quarter = (self.duration - self.warmup) / 4
            start = self.warmup + (int(phase[1:]) - 1) * quarter
            end = start + quarter
        return max(0.0, min(end, stop) - start)


@dataclass
class Tally:
    """Requests that ended within one window or phase."""

    ok: int = 0
    aborted: int = 0
    errors: int = 0
    abort_missed: int = 0  # an abort was planned but the answer was complete first
    output_tokens: int = 0
    ttft: list[float] = field(default_factory=list)  # streamed, completed
    e2e: list[float] = field(default_factory=list)  # completed

    def add(self, out: Outcome) -> None:
        if out.kind == "aborted":
            self.aborted += 1
        elif out.kind == "error":
            self.errors += 1
        else:
            self.ok += 1
            self.abort_missed += out.abort_planned
            self.output_tokens += out.output_tokens
            self.e2e.append(out.e2e)
            if out.ttft is not None:
                self.ttft.append(out.ttft)

    def summary(self, span_s: float) -> dict[str, Any]:
        span = max(span_s, 1e-9)
        return {
            "ok": self.ok,
            "aborted": self.aborted,
            "errors": self.errors,
            "abort_missed": self.abort_missed,
            "requests_per_s": self.ok / span,
            "output_tok_per_s": self.output_tokens / span,
            **_pcts("ttft", self.ttft),
            **_pcts("e2e", self.e2e),
        }


def _pcts(name: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"{name}_p50_s": None, f"{name}_p99_s": None}
    p50, p99 = np.percentile(np.asarray(values), [50, 99])
    return {f"{name}_p50_s": float(p50), f"{name}_p99_s": float(p99)}


class SoakRunner:
    def __init__(
        self, new_client: ClientFactory, probe: ServerProbe, mixer: Mixer, spec: SoakSpec, *, progress: bool = True
    ) -> None:
        self.new_client, self.probe, self.mixer, self.spec = new_client, probe, mixer, spec
        self.console = Console(stderr=True, soft_wrap=True) if progress else None
        self._t0 = time.perf_counter()
        self.samples: list[dict[str, Any]] = []
        self.window = Tally()
        self.phases = {p: Tally() for p in PHASES}
        self.prewarm = Tally()
        self.in_flight = 0
        self.error_types: Counter[str] = Counter()
        self.errors: list[dict[str, Any]] = []  # the first MAX_ERRORS_KEPT, in full
        self.stopped_at: float | None = None  # the load was ended early (stop()) at this time

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def stop(self) -> None:
        """End the load now: no stream sends again, the rest (drain, settle, end sample) runs as usual."""
        if self.stopped_at is None:
            self.stopped_at = self.now()

    async def run(self) -> dict[str, Any]:
        """The whole soak; returns the timeline (JSON-able). Cancelling it closes every connection."""
        spec = self.spec
        prewarm_t0 = time.perf_counter()
        if spec.prewarm:
            client = self.new_client()
            try:
                async with anyio.create_task_group() as tg:
                    for _ in range(spec.concurrency):
                        tg.start_soon(self._one, client, self.prewarm)
            finally:
                await client.aclose()
        prewarm_s = time.perf_counter() - prewarm_t0
        settle_before = await self._settle(None)
        self._t0 = time.perf_counter()
        await self._take("start", settle_before["sample"])
        await self._load()
        load_end = self.now()
        settle = await self._settle(self.samples[0]["fds"])
        await self._take("end", settle["sample"])
        return {
            "spec": {**asdict(spec), "warmup_s": spec.warmup},
            "samples": self.samples,
            "phases": {
                p: {**t.summary(self._span(p, load_end)), "span_s": self._span(p, load_end)}
                for p, t in self.phases.items()
            },
            "prewarm": self.prewarm.summary(prewarm_s),
            "totals": self._totals(),
            "errors": {"by_type": dict(self.error_types), "first": self.errors},
            "drain_s": load_end - min(spec.duration, self.stopped_at if self.stopped_at is not None else spec.duration),
            "stopped_early_at": self.stopped_at,
            "settle": {k: v for k, v in settle.items() if k != "sample"},
            "server_outcomes": dict(self.probe.outcomes),
        }

    async def _load(self) -> None:
        client = self.new_client()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._sampler, name="loadgen.soak.sampler")
                async with anyio.create_task_group() as streams:
                    for i in range(self.spec.concurrency):
                        streams.start_soon(self._stream, client, name=f"loadgen.soak.stream{i}")
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await client.aclose()

    async def _stream(self, client: SoakClient) -> None:
        while self.now() < self.spec.duration and self.stopped_at is None:
            await self._one(client, None)

    async def _one(self, client: SoakClient, tally: Tally | None) -> None:
        plan = self.mixer.draw()
        self.in_flight += 1
        try:
            out = await client.send(plan, self.now)
        finally:
            self.in_flight -= 1
        self.mixer.observe(out)
        if tally is None:
            self.window.add(out)
            self.phases[self._phase(out.end_s)].add(out)
        else:
            tally.add(out)
        if out.kind == "error":
            self.error_types[out.error_type or "?"] += 1
            if len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append({"t": out.end_s, "endpoint": out.endpoint, "stream": out.stream,
                                    "type": out.error_type, "message": out.error})  # fmt: skip

    async def _sampler(self) -> None:
        while True:
            await anyio.sleep(self.spec.sample_interval)
            await self._take(None, await self.probe.sample())

    async def _take(self, phase: str | None, server: dict[str, Any]) -> None:
        t = self.now()
        last_t = self.samples[-1]["t"] if self.samples else t
        window, self.window = self.window, Tally()
        sample = {
            "t": t,
            "phase": phase or self._phase(t),
            "in_flight": self.in_flight,
            **server,
            "window": window.summary(t - last_t),
            "totals": self._totals(),
        }
        self.samples.append(sample)
        if self.console is not None:
            self.console.print(_progress_line(sample), highlight=False)

    def _phase(self, t: float) -> str:
        return "drain" if self.stopped_at is not None and t >= self.stopped_at else self.spec.phase(t)

    def _totals(self) -> dict[str, int]:
        tallies = [*self.phases.values(), self.prewarm]
        return {k: sum(getattr(x, k) for x in tallies) for k in ("ok", "aborted", "errors", "abort_missed")}

    def _span(self, phase: str, load_end: float) -> float:
        return self.spec.span(phase, load_end, self.stopped_at)

    async def _settle(self, fds_before: int | None) -> dict[str, Any]:
        """Polls until no request holds KV or waits, and the fds are back (``fds_before`` ±
        tolerance) or, with no reference yet, unchanged over two reads. Returns how long it took."""
        start = time.perf_counter()
        prev: dict[str, Any] | None = None
        with anyio.move_on_after(self.spec.settle_timeout):
            while True:
                s = await self.probe.sample()
                idle = all(s.get(k) in (0, 0.0, None) for k in ("kv_used", "running", "waiting"))
                if fds_before is not None:
                    fds_back = s["fds"] is None or abs(s["fds"] - fds_before) <= self.spec.fd_tolerance
                else:
                    fds_back = prev is not None and prev["fds"] == s["fds"]
                if idle and fds_back and s["server_alive"]:
                    return {"settled": True, "seconds": time.perf_counter() - start, "sample": s}
                prev = s
                await anyio.sleep(0.5)
        return {"settled": False, "seconds": time.perf_counter() - start, "sample": await self.probe.sample()}


def _progress_line(s: dict[str, Any]) -> str:
    w, tot = s["window"], s["totals"]
    rss = "–" if s.get("rss_bytes") is None else f"{s['rss_bytes'] / 2**20:.0f}"
    kv = "–" if s.get("kv_used") is None else f"{s['kv_used']:.0f}"
    ttft = "–" if w["ttft_p50_s"] is None else f"{w['ttft_p50_s'] * 1000:.0f}"
    return (
        f"t={s['t']:7.1f}s {s['phase']:>6}  in flight {s['in_flight']:3d}  ok {tot['ok']}  aborted {tot['aborted']}  "
        f"errors {tot['errors']}  rss {rss} MiB  fds {s.get('fds')}  kv {kv}  "
        f"ttft p50 {ttft} ms  {w['output_tok_per_s']:.0f} tok/s"
    )

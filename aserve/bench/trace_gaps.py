"""Where a step trace's device idle goes (a trace from ``--trace-path`` / ``trace_path``).

    python -m aserve.bench.trace_gaps TRACE.json [--split-ms 500] [--top 8]

The trace is cut into runs where the device was idle longer than ``--split-ms`` (a client's
pause between repeats). For each run: its steps, busy time, the idle between steps and, inside
that idle, which host spans (plan, prepare, launch, commit) ran and how long no span ran at all
(the loop was elsewhere: ingest, IPC, waiting for requests); the largest gaps with the batch on
either side; the idle by gap size.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Gap:
    us: float
    before_step: int
    at_ms: float  # from the run's first step
    seqs: tuple[int, int]  # the steps either side
    tokens: tuple[int, int]
    host_us: dict[str, float]


@dataclass
class Run:
    steps: int
    span_us: float
    busy_us: float
    median_step_us: float
    gaps: list[Gap] = field(default_factory=list)

    @property
    def idle_us(self) -> float:
        return sum(g.us for g in self.gaps)

    def host_in_gaps(self) -> dict[str, float]:
        """Microseconds of each host span inside the gaps, and of none ('no host span')."""
        out: dict[str, float] = {}
        for g in self.gaps:
            for k, v in g.host_us.items():
                out[k] = out.get(k, 0.0) + v
            out["no host span"] = out.get("no host span", 0.0) + max(0.0, g.us - sum(g.host_us.values()))
        return out


def analyze(events: list[dict[str, Any]], split_us: float = 5e5, min_gap_us: float = 20.0) -> list[Run]:
    device: list[tuple[float, float, int, int, int]] = []
    host: list[tuple[float, float, str]] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        name, args = e["name"], e.get("args", {})
        if name.startswith("step "):
            device.append((e["ts"], e["ts"] + e["dur"], int(name[5:]), args.get("seqs", 0), args.get("tokens", 0)))
        else:
            host.append((e["ts"], e["ts"] + e["dur"], name))
    device.sort()
    host.sort()
    groups: list[list[tuple[float, float, int, int, int]]] = []
    for d in device:
        if not groups or d[0] - groups[-1][-1][1] > split_us:
            groups.append([])
        groups[-1].append(d)
    runs = []
    for steps in groups:
        run = Run(len(steps), steps[-1][1] - steps[0][0], sum(b - a for a, b, *_ in steps),
                  statistics.median(b - a for a, b, *_ in steps))  # fmt: skip
        for p, q in itertools.pairwise(steps):
            w0, w1 = p[1], q[0]
            if w1 - w0 <= min_gap_us:
                continue
            cover: dict[str, float] = {}
            for a, b, name in host:
                if a >= w1:
                    break
                if b > w0:
                    cover[name] = cover.get(name, 0.0) + min(b, w1) - max(a, w0)
            run.gaps.append(Gap(w1 - w0, q[2], (w0 - steps[0][0]) / 1e3, (p[3], q[3]), (p[4], q[4]), cover))
        runs.append(run)
    return runs


def report(runs: list[Run], top: int = 8) -> str:
    lines = []
    for i, r in enumerate(runs):
        lines.append(f"run {i}: {r.steps} steps over {r.span_us / 1e6:.3f} s, busy {r.busy_us / 1e6:.3f} s, "
                     f"idle {r.idle_us / 1e6:.3f} s ({r.idle_us / max(r.span_us, 1e-9):.1%}), "
                     f"median step {r.median_step_us:.0f} us")  # fmt: skip
        host = {k: round(v / 1e6, 4) for k, v in sorted(r.host_in_gaps().items())}
        lines.append(f"  host spans inside the idle (s): {host}")
        for g in sorted(r.gaps, key=lambda g: -g.us)[:top]:
            lines.append(f"  {g.us / 1e3:8.2f} ms before step {g.before_step} at {g.at_ms:9.1f} ms: seqs "
                         f"{g.seqs[0]}->{g.seqs[1]}, tokens {g.tokens[0]}->{g.tokens[1]}, host "
                         f"{ {k: round(v) for k, v in g.host_us.items()} }")  # fmt: skip
        sizes = [0.0, 0.0, 0.0, 0.0]
        for g in r.gaps:
            sizes[(g.us >= 100) + (g.us >= 1_000) + (g.us >= 10_000)] += g.us
        lines.append(
            "  idle by gap size, <0.1 / <1 / <10 / >=10 ms (s): " + " / ".join(f"{s / 1e6:.4f}" for s in sizes)
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--split-ms", type=float, default=500.0, help="idle longer than this starts a new run")
    ap.add_argument("--top", type=int, default=8, help="the largest gaps to list per run")
    a = ap.parse_args(argv)
    data = json.loads(Path(a.trace).read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    print(report(analyze(events, a.split_ms * 1e3), a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The soak's verdict and tables: printed (rich) and written as Markdown, from the timeline alone.

The verdict's checks (each ``pass``, ``fail`` or ``n/a`` when the server does not give the
figure):

* ``rss_flat``: mean RSS of the last quarter of the load minus that of the first quarter (the
  warm-up left out) is at most ``rss_growth_limit_mib``. The least-squares slope over the same
  samples is reported beside it, in MiB per hour.
* ``fds_back``: open fds at the idle ``end`` sample within ``fd_tolerance`` of the idle
  ``start`` sample (both with the load's connections closed).
* ``kv_drained``: at the ``end`` sample no KV is held by requests and none run or wait.
* ``no_errors``: no request failed (planned aborts are not failures); the server stayed up.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

MIB = 2**20
QUARTERS = ("q1", "q2", "q3", "q4")


def _series(samples: Sequence[dict[str, Any]], key: str, phases: Sequence[str]) -> list[tuple[float, float]]:
    return [(s["t"], float(s[key])) for s in samples if s["phase"] in phases and s.get(key) is not None]


def _mean(points: Sequence[tuple[float, float]]) -> float | None:
    return float(np.mean([v for _, v in points])) if points else None


def verdict(timeline: dict[str, Any]) -> dict[str, Any]:
    spec, samples = timeline["spec"], timeline["samples"]
    start, end = samples[0], samples[-1]
    checks: dict[str, dict[str, Any]] = {}

    q1, q4 = _series(samples, "rss_bytes", ["q1"]), _series(samples, "rss_bytes", ["q4"])
    load = _series(samples, "rss_bytes", QUARTERS)
    if q1 and q4:
        growth = ((_mean(q4) or 0.0) - (_mean(q1) or 0.0)) / MIB
        slope = (
            float(np.polyfit([t for t, _ in load], [v for _, v in load], 1)[0]) * 3600 / MIB if len(load) > 1 else 0.0
        )
        checks["rss_flat"] = {
            "status": "pass" if growth <= spec["rss_growth_limit_mib"] else "fail",
            "growth_mib": growth,
            "slope_mib_per_hour": slope,
            "detail": f"RSS mean, last quarter − first quarter: {growth:+.1f} MiB (limit {spec['rss_growth_limit_mib']:g} "
            f"MiB); slope {slope:+.1f} MiB/h over the load after the warm-up",
        }
    else:
        checks["rss_flat"] = {"status": "n/a", "detail": "no RSS samples in the first and last quarters"}

    if start.get("fds") is not None and end.get("fds") is not None:
        diff = int(end["fds"] - start["fds"])
        before, after = start.get("fd_kinds") or {}, end.get("fd_kinds") or {}
        changed = {k: after.get(k, 0) - before.get(k, 0) for k in sorted({*before, *after})}
        changed = {k: d for k, d in changed.items() if d}
        checks["fds_back"] = {
            "status": "pass" if abs(diff) <= spec["fd_tolerance"] else "fail",
            "start": start["fds"],
            "end": end["fds"],
            "by_kind_change": changed,
            "detail": f"open fds idle before {start['fds']}, idle after {end['fds']} ({diff:+d}, tolerance "
            f"±{spec['fd_tolerance']})" + (f"; by kind {changed}" if changed else ""),
        }
    else:
        checks["fds_back"] = {"status": "n/a", "detail": "fds not measured"}

    if end.get("kv_used") is not None:
        busy = {k: end.get(k) for k in ("kv_used", "running", "waiting")}
        drained = all(not v for v in busy.values())
        settle = timeline["settle"]
        checks["kv_drained"] = {
            "status": "pass" if drained else "fail",
            **busy,
            "detail": f"after the drain: KV used {_num(end['kv_used'], 1)} tokens, running {_num(end.get('running'), 1)}, "
            f"waiting {_num(end.get('waiting'), 1)} ({'settled' if settle['settled'] else 'not settled'} "
            f"{settle['seconds']:.1f} s after the load's connections closed)",
        }
    else:
        checks["kv_drained"] = {"status": "n/a", "detail": "the server exports no KV gauge"}

    tot = timeline["totals"]
    alive = all(s.get("server_alive", True) for s in samples)
    checks["no_errors"] = {
        "status": "pass" if tot["errors"] == 0 and alive else "fail",
        "errors": tot["errors"],
        "server_alive": alive,
        "detail": f"{tot['errors']} errors{' ' + str(timeline['errors']['by_type']) if tot['errors'] else ''} in "
        f"{tot['ok'] + tot['aborted'] + tot['errors']} "
        f"requests ({tot['aborted']} aborted on purpose)" + ("" if alive else "; the server process died"),
    }
    passed = all(c["status"] != "fail" for c in checks.values())
    return {"passed": passed, "checks": checks}


def state_rows(samples: Sequence[dict[str, Any]]) -> list[list[str]]:
    """RSS, fds, threads, processes, KV: idle start, idle end, max, first/last quarter mean."""
    rows = []
    for key, name, scale in (("rss_bytes", "RSS (MiB)", MIB), ("fds", "open fds", 1), ("threads", "threads", 1),
                             ("procs", "processes", 1), ("kv_used", "KV used (tokens)", 1), ("kv_cached", "prefix cache (tokens)", 1),
                             ("in_flight", "in flight (client)", 1)):  # fmt: skip
        vals = [float(s[key]) for s in samples if s.get(key) is not None]
        if not vals:
            continue
        q1, q4 = _mean(_series(samples, key, ["q1"])), _mean(_series(samples, key, ["q4"]))
        first, last = samples[0].get(key), samples[-1].get(key)
        rows.append([name, *(_num(x, scale) for x in (first, last, max(vals), q1, q4))])
    return rows


def phase_rows(timeline: dict[str, Any]) -> list[list[str]]:
    rows = []
    for phase, p in timeline["phases"].items():
        if p["ok"] + p["aborted"] + p["errors"] == 0:
            continue
        means = [_mean(_series(timeline["samples"], k, [phase])) for k in ("rss_bytes", "fds", "kv_used")]
        rows.append([
            phase, f"{p['span_s']:.0f}", str(p["ok"]), str(p["aborted"]), str(p["errors"]),
            f"{p['requests_per_s']:.2f}", f"{p['output_tok_per_s']:.1f}",
            _num(p["ttft_p50_s"], 1e-3), _num(p["ttft_p99_s"], 1e-3), _num(p["e2e_p50_s"], 1e-3),
            _num(p["e2e_p99_s"], 1e-3), _num(means[0], MIB), _num(means[1], 1), _num(means[2], 1),
        ])  # fmt: skip
    return rows


STATE_COLS = ("", "start (idle)", "end (idle)", "max", "q1 mean", "q4 mean")
PHASE_COLS = ("phase", "s", "ok", "aborted", "errors", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms",
              "E2E p50 ms", "E2E p99 ms", "RSS MiB", "fds", "KV used")  # fmt: skip


def _num(x: Any, scale: float) -> str:
    if x is None:
        return "–"
    v = float(x) / scale
    return f"{v:.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.1f}"


def summary_lines(timeline: dict[str, Any]) -> list[str]:
    tot, v = timeline["totals"], timeline["verdict"]
    stopped = timeline.get("stopped_early_at")
    lines = [f"the load was stopped early at t={stopped:.1f}s (signal)"] if stopped is not None else []
    lines += [
        f"requests: {tot['ok']} completed, {tot['aborted']} aborted on purpose ({tot['abort_missed']} planned aborts "
        f"answered first), {tot['errors']} errors; drain {timeline['drain_s']:.1f} s",
        f"server's own count by outcome: {timeline['server_outcomes'] or 'not exported'}",
    ]
    for e in timeline["errors"]["first"][:5]:
        lines.append(f"  error at t={e['t']:.1f}s {e['endpoint']} stream={e['stream']}: {e['type']}: {e['message']}")
    for name, c in v["checks"].items():
        lines.append(f"{name}: {c['status'].upper()} — {c['detail']}")
    lines.append(f"verdict: {'PASS' if v['passed'] else 'FAIL'}")
    return lines


def print_report(timeline: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    for title, cols, rows in (("server state", STATE_COLS, state_rows(timeline["samples"])),
                              ("per phase (requests by the time they ended)", PHASE_COLS, phase_rows(timeline))):  # fmt: skip
        t = Table(title=f"soak · {timeline['run']['label']} · {title}")
        for i, c in enumerate(cols):
            t.add_column(c, justify="left" if i == 0 else "right")
        for row in rows:
            t.add_row(*row)
        console.print(t)
    for line in summary_lines(timeline):
        console.print(line, highlight=False, markup=False)


def write_markdown(timeline: dict[str, Any], path: Path) -> None:
    out = []
    for cols, rows in ((STATE_COLS, state_rows(timeline["samples"])), (PHASE_COLS, phase_rows(timeline))):
        out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out.append("")
    out += [f"- {line}" for line in summary_lines(timeline)]
    path.write_text("\n".join(out) + "\n")

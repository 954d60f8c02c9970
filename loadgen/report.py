"""Writing a run down: console table, JSON summary, per-request JSONL and CSV."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loadgen.records import RequestRecord

CSV_FIELDS = (
    "index", "warmup", "scheduled_s", "send_s", "done_s", "prompt_tokens", "max_tokens", "output_tokens",
    "usage_prompt_tokens", "usage_completion_tokens", "ttft", "tpot", "e2e", "chunks", "status",
    "error_type", "error",
)  # fmt: skip


def print_table(summary: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    meta = summary.get("run", {})
    title = f"loadgen · {meta.get('label', '')} · {meta.get('target', '')}"
    t = Table(title=title, show_header=True)
    t.add_column("metric")
    for c in ("mean", "std", "p50", "p90", "p95", "p99", "p99_9"):
        t.add_column(c, justify="right")
    for name, d in summary["latency_s"].items():
        t.add_row(f"{name} (ms)", *[_fmt(d.get(c), 1000) for c in ("mean", "std", "p50", "p90", "p95", "p99", "p99_9")])
    d = summary["tokens_per_chunk"]
    t.add_row("tokens/chunk", *[_fmt(d.get(c)) for c in ("mean", "std", "p50", "p90", "p95", "p99", "p99_9")])
    console.print(t)
    req, thr, good = summary["requests"], summary["throughput"], summary["goodput"]
    lines = [
        f"requests: sent {req['sent']}, completed {req['completed']}, failed {req['failed']}, "
        f"unfinished {len(req['unfinished'])}"
        + (f", not sent {req['not_sent']}" if req.get("not_sent") else "")
        + f"; duration {summary['duration_s']:.2f} s",
        f"throughput: {thr['requests_per_s']:.2f} req/s, input {thr['input_tok_per_s']:.1f} tok/s, "
        f"output {thr['output_tok_per_s']:.1f} tok/s (peak {thr['peak_output_tok_per_s']:.0f} in 1 s), "
        f"total {thr['total_tok_per_s']:.1f} tok/s",
        f"concurrency: max {summary['concurrency']['max_in_flight']}, mean {summary['concurrency']['mean_in_flight']:.2f}",
        f"goodput {good['slo']}: {good['requests_per_s']:.2f} req/s ({good['fraction'] * 100:.1f}% of requests)",
    ]
    if summary.get("steady_state", {}).get("output_tok_per_s") is not None:
        ss = summary["steady_state"]
        lines.append(
            f"steady state [{ss['start_s']:.2f}, {ss['end_s']:.2f}] s: {ss['output_tok_per_s']:.1f} output tok/s"
        )
    client = summary.get("client")
    if client:
        lines.append(
            f"client: loop lag p99 {_fmt(client['loop_lag_s'].get('p99'), 1000)} ms, "
            f"send lag p99 {_fmt(client['send_lag_s'].get('p99'), 1000)} ms"
        )
    server = summary.get("server")
    if server:
        lines.append("server: " + ", ".join(f"{k} {v:.4g}" for k, v in server.items()))
    if summary["failures"]["by_type"]:
        lines.append(f"failures: {summary['failures']['by_type']} by status {summary['failures']['by_status']}")
        for k, msg in summary["failures"]["first_messages"].items():
            lines.append(f"  first {k}: {msg[:160]}")
    for w in summary.get("warnings", []):
        lines.append(f"[yellow]warning:[/] {w}")
    lines.append(f"run complete: {'yes' if summary['run'].get('complete') else 'no'}")
    for line in lines:
        console.print(line, highlight=False)


def _fmt(x: Any, scale: float = 1.0) -> str:
    return "–" if x is None else f"{float(x) * scale:.2f}"


def write_json(summary: dict[str, Any], path: Path) -> None:
    # JSON has no Infinity or NaN (``--rate inf``, an empty percentile): they are written as null.
    path.write_text(json.dumps(_finite(summary), indent=2, default=float, allow_nan=False))


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (recursively)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_jsonl(records: Sequence[RequestRecord], path: Path) -> None:
    with path.open("w") as f:
        for r in records:
            f.write(json.dumps(r.to_dict()) + "\n")


def read_jsonl(path: Path) -> list[RequestRecord]:
    return [RequestRecord.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def write_csv(records: Sequence[RequestRecord], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in records:
            d = r.to_dict()
            d["chunks"] = len(r.chunk_s)
            w.writerow({k: d.get(k) for k in CSV_FIELDS})

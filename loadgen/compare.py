"""``loadgen compare``: every numeric metric of B (C, ...) over A, with bootstrap CIs.

Each argument is one setting; repeated runs of a setting are joined with commas. The CI
resamples runs within each setting, so it needs at least two runs per side.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loadgen.stats import bootstrap_ratio_ci

SKIP = {"series", "run", "files", "failures", "token_check", "warnings", "slo", "unfinished"}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in d.items():
        if k in SKIP:
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
            out[key] = float(v)
    return out


def compare_groups(groups: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """Rows per metric: each group's mean over its runs and its ratio to group 0 with a CI."""
    flat = [[flatten(s) for s in g] for g in groups]
    metrics = sorted(set().union(*(f.keys() for g in flat for f in g)))
    rows = []
    for m in metrics:
        base = [f[m] for f in flat[0] if m in f]
        row: dict[str, Any] = {"metric": m, "means": [], "ratios": []}
        for g in flat:
            vals = [f[m] for f in g if m in f]
            row["means"].append(sum(vals) / len(vals) if vals else None)
        for g in flat[1:]:
            vals = [f[m] for f in g if m in f]
            ratio, lo, hi = bootstrap_ratio_ci(base, vals)
            row["ratios"].append({"ratio": ratio, "ci95": [lo, hi] if lo is not None else None})
        rows.append(row)
    return {"runs_per_group": [len(g) for g in groups], "rows": rows}


def print_comparison(result: dict[str, Any], names: Sequence[str], console: Console | None = None) -> None:
    console = console or Console()
    t = Table(title=f"compare (ratios to {names[0]}; 95% bootstrap CI over runs)")
    t.add_column("metric")
    for n in names:
        t.add_column(f"{n} mean", justify="right")
    for n in names[1:]:
        t.add_column(f"{n}/{names[0]}", justify="right")
    for row in result["rows"]:
        means = ["–" if v is None else f"{v:.4g}" for v in row["means"]]
        ratios = []
        for r in row["ratios"]:
            if r["ratio"] is None:
                ratios.append("–")
            elif r["ci95"]:
                ratios.append(f"{r['ratio']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]")
            else:
                ratios.append(f"{r['ratio']:.3f}")
        t.add_row(row["metric"], *means, *ratios)
    console.print(t)


def cmd_compare(groups: Sequence[str], out: str | None) -> int:
    loaded = [[json.loads(Path(p).read_text()) for p in g.split(",") if p] for g in groups]
    names = [Path(g.split(",")[0]).stem + (f" ×{len(g.split(','))}" if "," in g else "") for g in groups]
    result = compare_groups(loaded)
    result["groups"] = [g.split(",") for g in groups]
    print_comparison(result, names)
    if out:
        Path(out).write_text(json.dumps(result, indent=2))
    return 0

"""``loadgen overlap-ab``: the same fixed-schedule workload with overlap on and off.

Each mode gets its own fresh aserve (server subprocess, or in-process engine with
``--engine``) and ``--repeats`` runs; the report is the on/off ratio of every metric with
bootstrap CIs over the repeats, and the server's device-gap figures side by side.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.table import Table

from loadgen import plots
from loadgen.compare import compare_groups, print_comparison
from loadgen.launcher import aserve_server
from loadgen.metrics import SLO
from loadgen.runner import Stopper, stoppable
from loadgen.session import TargetSpec, build_workload, open_target, run_once, save_run
from loadgen.specs import load_spec, target_spec, workload_spec

SERVER_KEYS = ("device_busy_s", "device_gap_s", "device_gap_fraction", "mean_gap_per_step_ms", "engine_steps",
               "host_plan_s", "host_launch_s", "host_commit_s")  # fmt: skip


@asynccontextmanager
async def _mode_target(
    a: argparse.Namespace, base: TargetSpec, overlap: bool, out_dir: Path
) -> AsyncIterator[TargetSpec]:
    if a.engine:
        yield replace(base, base_url=None, engine_options={**base.engine_options, "overlap": overlap})
        return
    if a.base_url:
        raise SystemExit("overlap-ab starts its own servers; drop --base-url (or use --engine)")
    args = [*a.server_arg] + ([] if overlap else ["--disable-overlap"])
    log = out_dir / f"{a.label}_server_overlap_{'on' if overlap else 'off'}.log"
    async with aserve_server(args, log) as url:
        yield replace(base, base_url=url, api_key=None)


async def cmd_overlap_ab(a: argparse.Namespace) -> int:
    base = target_spec(a, require_target=False)
    wspec, load, slo = workload_spec(a), load_spec(a), SLO.parse(a.slo)
    out_dir = Path(a.out)
    await anyio.Path(out_dir).mkdir(parents=True, exist_ok=True)
    summaries: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    runs: list[plots.Run] = []

    async def body(stopper: Stopper) -> None:
        for mode in ("off", "on"):
            async with _mode_target(a, base, mode == "on", out_dir) as tspec, open_target(tspec) as (target, tok):
                await target.wait_ready(tspec.ready_timeout)
                items = build_workload(wspec, tok)  # same seed: the same prompts in both modes
                for rep in range(a.repeats):
                    if stopper.stopped:
                        return
                    label = f"{a.label}_overlap_{mode}_rep{rep}"
                    meta = {"target": tspec.base_url or "in-process engine", "overlap": mode == "on",
                            "workload": dict(wspec.__dict__), "repeat": rep, "ignore_eos": tspec.ignore_eos}  # fmt: skip
                    summary, records, warm = await run_once(
                        target, items, load, slo, label=label, meta=meta, progress=a.progress, stopper=stopper
                    )
                    save_run(out_dir, label, summary, records, warm, do_plots=False)
                    req = summary["requests"]
                    Console().print(
                        f"{label}: completed {req['completed']}, failed {req['failed']}, "
                        f"{summary['throughput']['output_tok_per_s']:.1f} output tok/s",
                        highlight=False,
                    )
                    for w in summary["warnings"]:  # a failed request makes the comparison suspect: say so
                        Console().print(f"[yellow]warning:[/] {w}", highlight=False)
                    summaries[mode].append(summary)
                    runs.append((label, records, summary))

    if (await stoppable(body, "overlap A/B")).stopped:
        Console().print(f"stopped early: {len(runs)} run(s) written to {out_dir}, no comparison", highlight=False)
        return 1
    result = compare_groups([summaries["off"], summaries["on"]])
    result["server_side_by_side"] = {
        mode: {k: _mean([s["server"].get(k) for s in summaries[mode] if s.get("server")]) for k in SERVER_KEYS}
        for mode in ("off", "on")
    }
    result["fingerprints"] = sorted({s["run"]["fingerprint"] for m in summaries.values() for s in m})
    console = Console()
    print_comparison(result, ["overlap off", "overlap on"], console)
    t = Table(title="server view (mean over repeats)")
    t.add_column("figure")
    t.add_column("overlap off", justify="right")
    t.add_column("overlap on", justify="right")
    for k in SERVER_KEYS:
        off, on = result["server_side_by_side"]["off"][k], result["server_side_by_side"]["on"][k]
        t.add_row(k, "–" if off is None else f"{off:.4g}", "–" if on is None else f"{on:.4g}")
    console.print(t)
    if a.plots:
        plots.cdfs(runs, out_dir / f"{a.label}_overlap_cdf.png")
    path = out_dir / f"{a.label}_overlap_ab.json"
    path.write_text(json.dumps(result, indent=2))
    console.print(f"overlap A/B written to {path}")
    return 0


def _mean(vals: list[Any]) -> float | None:
    xs = [float(v) for v in vals if v is not None]
    return sum(xs) / len(xs) if xs else None

"""``python -m loadgen run | compare | overlap-ab | soak``: argument parsing and orchestration."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from loadgen import plots, report
from loadgen.metrics import SLO
from loadgen.runner import LoadSpec, Stopper, stoppable
from loadgen.session import build_workload, open_target, run_once, save_run
from loadgen.soak_cmd import add_soak_args
from loadgen.specs import load_spec, target_spec, workload_spec


def add_target_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target")
    g.add_argument("--base-url", default=None, help="OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    g.add_argument("--engine", action="store_true", help="run an in-process aserve.Engine instead of HTTP")
    g.add_argument("--engine-opt", action="append", metavar="KEY=VALUE", help="engine option (repeatable)")
    g.add_argument("--model", default=None,
                   help="model name in requests (default: the server's first in /v1/models; in process, "
                   "the engine's default model)")  # fmt: skip
    g.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    g.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY") or os.environ.get("ASERVE_API_KEY"))
    g.add_argument("--tokenizer", default=None, help="a .gguf or HF directory (default: the model's)")
    g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    g.add_argument("--return-token-ids", action="store_true",
                   help="ask an HTTP server for each chunk's token ids (vLLM's and aserve's return_token_ids) "
                   "and count tokens from them instead of tokenizing every chunk's text on the client's loop")  # fmt: skip
    g.add_argument("--request-timeout", type=float, default=600.0)
    g.add_argument("--ready-timeout", type=float, default=300.0)


def add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=("random", "shared-prefix", "sharegpt", "trace"), default="random")
    g.add_argument("--num-requests", type=int, default=None,
                   help="requests to send (default: 50; a trace: all its lines)")  # fmt: skip
    g.add_argument("--input-len", type=int, default=32)
    g.add_argument("--output-len", type=int, default=None,
                   help="tokens to generate (default: 16; sharegpt: each reply's length)")  # fmt: skip
    g.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in [L(1-r), L(1+r)]")
    g.add_argument("--groups", type=int, default=4)
    g.add_argument("--per-group", type=int, default=8)
    g.add_argument("--system-len", type=int, default=64)
    g.add_argument("--question-len", type=int, default=16)
    g.add_argument("--dataset", default=None, help="ShareGPT JSON/JSONL or trace JSONL")
    g.add_argument("--seed", type=int, default=0)


def add_load_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("arrivals")
    g.add_argument("--rate", type=float, default=math.inf, help="requests/s (default inf: all at once)")
    g.add_argument("--arrival", choices=("poisson", "constant", "gamma"), default="poisson")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (<1 burstier)")
    g.add_argument("--max-concurrency", type=int, default=None)
    g.add_argument("--users", type=int, default=None, help="closed loop with this many users")
    g.add_argument("--think-time", type=float, default=0.0)
    g.add_argument("--duration", type=float, default=None)
    g.add_argument("--warmup", type=int, default=0, help="requests sent before, excluded from results")
    g.add_argument("--run-timeout", type=float, default=None)
    g.add_argument("--slo", default=None, help="e.g. ttft=500ms,tpot=50ms,e2e=5s")


def add_output_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--out", default="loadgen-results")
    g.add_argument("--label", default="run")
    g.add_argument("--no-plots", dest="plots", action="store_false")
    g.add_argument("--no-progress", dest="progress", action="store_false")


async def cmd_run(a: argparse.Namespace) -> int:
    tspec, wspec, base = target_spec(a), workload_spec(a), load_spec(a)
    shard = tuple(int(x) for x in a.shard.split("/")) if a.shard else None
    if shard is not None:
        # One of --client-procs K processes: its own arrivals (K streams from one seed would
        # arrive in step: the same gaps K times over), the same workload split K ways.
        base = replace(base, seed=hash((base.seed, shard[0])) & 0x7FFF_FFFF)
    slo = SLO.parse(a.slo)
    steps: list[tuple[str, float, LoadSpec]] = [("", base.rate, base)]
    if a.sweep_rates:
        steps = [(f"_rate{r:g}", r, replace(base, rate=r)) for r in a.sweep_rates]
    elif a.sweep_concurrency:
        steps = [(f"_conc{c:g}", c, replace(base, max_concurrency=int(c))) for c in a.sweep_concurrency]
    out_dir = Path(a.out)
    console = Console()
    runs: list[plots.Run] = []
    points: list[tuple[float, dict[str, Any]]] = []

    async def body(stopper: Stopper) -> None:
        """Every point of the sweep and every repeat, each saved as it ends."""
        async with open_target(tspec) as (target, tok):
            await target.wait_ready(tspec.ready_timeout)
            items = build_workload(wspec, tok)
            if shard is not None:  # every K-th request
                items = items[shard[0] :: shard[1]]
            barrier = await _start_barrier(a.start_barrier) if a.start_barrier else None
            for suffix, value, load in steps:
                for rep in range(a.repeats):
                    if stopper.stopped:  # stopped before this point began: nothing to run
                        return
                    label = f"{a.label}{suffix}" + (f"_rep{rep}" if a.repeats > 1 else "")
                    meta = {
                        "target": tspec.base_url or "in-process engine",
                        "endpoint": tspec.endpoint,
                        "model": target.model,
                        "engine_options": tspec.engine_options,
                        "ignore_eos": tspec.ignore_eos,
                        "workload": dict(wspec.__dict__),
                        "sweep_value": value,
                        "repeat": rep,
                        **({"barrier": barrier} if barrier else {}),
                    }
                    summary, records, warm = await run_once(
                        target,
                        items,
                        load,
                        slo,
                        label=label,
                        meta=meta,
                        progress=a.progress,
                        scrape=not a.shard,
                        stopper=stopper,
                    )
                    save_run(out_dir, label, summary, records, warm, do_plots=a.plots)
                    report.print_table(summary, console)
                    runs.append((label, records, summary))
                    points.append((value, summary))

    await stoppable(body, "run")
    if a.plots and len(runs) > 1:
        plots.cdfs(runs, out_dir / f"{a.label}_cdf_overlay.png")
        plots.over_time(runs, out_dir / f"{a.label}_over_time_overlay.png")
        plots.sweep_tradeoff([(lbl, s) for lbl, _, s in runs], out_dir / f"{a.label}_sweep_tput_vs_p99_tpot.png")
        plots.goodput_vs_rate(points, out_dir / f"{a.label}_sweep_goodput_vs_rate.png")
    console.print(f"results in {out_dir}")
    return 0


async def _start_barrier(ready_file: str) -> dict[str, float]:
    """One of ``--client-procs`` processes, ready to send: say so (``ready_file``) and wait for
    the parent's line on stdin, which it writes to every process at once."""
    ready = time.perf_counter()
    await anyio.Path(ready_file).touch()
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    if not line:
        raise SystemExit("loadgen: the parent process closed the start barrier without releasing it")
    return {"ready_perf": ready, "released_perf": time.perf_counter()}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations: a child of --client-procs gets the parent's flags, and an abbreviated
    # one it does not recognise would start children of its own.
    parser = argparse.ArgumentParser(prog="python -m loadgen", description=__doc__, allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", allow_abbrev=False, help="one run, or a sweep over rates / concurrencies")
    add_target_args(run)
    add_workload_args(run)
    add_load_args(run)
    add_output_args(run)
    run.add_argument("--sweep-rates", type=_floats, default=None, help="e.g. 1,2,4,inf")
    run.add_argument("--sweep-concurrency", type=_floats, default=None, help="e.g. 1,4,16")
    run.add_argument("--repeats", type=int, default=1)
    run.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="send from this many client processes and merge (a Python client tops out near 10k events/s)",
    )
    run.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # i/K: this client process's share
    run.add_argument("--start-barrier", default=None, help=argparse.SUPPRESS)  # a ready file; stdin says go

    cmp_ = sub.add_parser("compare", allow_abbrev=False, help="ratios of every metric, B/A, with bootstrap CIs")
    cmp_.add_argument("groups", nargs="+", help="JSON summaries; join repeated runs of one setting with commas")
    cmp_.add_argument("--out", default=None, help="write the comparison as JSON here")

    ab = sub.add_parser(
        "overlap-ab", allow_abbrev=False, help="overlap on vs off on an identical fixed-schedule workload"
    )
    add_target_args(ab)
    add_workload_args(ab)
    add_load_args(ab)
    add_output_args(ab)
    ab.add_argument("--repeats", type=int, default=3)
    ab.add_argument("--server-arg", action="append", default=[], help="extra `aserve serve` argument (repeatable)")

    soak = sub.add_parser(
        "soak",
        allow_abbrev=False,
        help="N requests in flight for a duration, mixed endpoints and aborts; server RSS, fds, KV over time",
    )
    add_soak_args(soak)

    from loadgen.simulate_cmd import add_simulate_args

    sim = sub.add_parser(
        "simulate",
        allow_abbrev=False,
        help="router policies against N simulated replicas (cost model): throughput and hit rate",
    )
    add_workload_args(sim)
    add_simulate_args(sim)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if a.command == "run" and a.client_procs > 1:
        if a.engine or a.sweep_rates or a.sweep_concurrency or a.repeats > 1:
            raise SystemExit("--client-procs runs one HTTP run (no --engine, sweeps or --repeats)")
        from loadgen.fanout import run_fanout

        return run_fanout(a, argv)
    if a.command == "run":
        return anyio.run(cmd_run, a)
    if a.command == "soak":
        from loadgen.soak_cmd import cmd_soak

        return anyio.run(cmd_soak, a, argv)
    if a.command == "simulate":
        from loadgen.simulate_cmd import cmd_simulate

        return cmd_simulate(a)
    if a.command == "compare":
        from loadgen.compare import cmd_compare

        return cmd_compare(a.groups, a.out)
    from loadgen.overlap_ab import cmd_overlap_ab

    return anyio.run(cmd_overlap_ab, a)


if __name__ == "__main__":
    sys.exit(main())

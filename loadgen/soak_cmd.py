"""``python -m loadgen soak``: the server (given, or started here), the prompts, the soak, the files.

Writes ``<label>.json`` (the timeline, the verdict and how it was run), ``<label>.png`` and
``<label>_table.md`` under ``--out``; exits 1 when the verdict fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from loadgen import plots, report
from loadgen.launcher import aserve_process
from loadgen.procstat import sample_tree
from loadgen.runner import stop_on_signal
from loadgen.session import load_tokenizer
from loadgen.soak import SoakRunner, SoakSpec
from loadgen.soak_client import ENDPOINTS, Mixer, MixSpec, SoakClient
from loadgen.soak_probe import ServerProbe
from loadgen.soak_report import print_report, verdict, write_markdown
from loadgen.target_http import HttpTarget
from loadgen.workloads import random_workload


def add_soak_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--base-url", "--url", dest="base_url", default=None,
                   help="a running server (default: start `aserve serve` on a free loopback port)")  # fmt: skip
    g.add_argument("--server-pid", type=int, default=None,
                   help="with --base-url: the server's pid, for RSS and fds from /proc (with its child processes); "
                   "without it they come from process_* gauges in /metrics, if any")  # fmt: skip
    g.add_argument("--server-arg", action="append", default=[], help="extra `aserve serve` argument (repeatable)")
    g.add_argument("--model", default=None, help="model name in requests (default: the first in /v1/models)")
    g.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY") or os.environ.get("ASERVE_API_KEY"))
    g.add_argument("--tokenizer", default=None, help="a .gguf or HF directory (default: the model's)")
    g.add_argument("--kv-metric", default="aserve_kv_used_tokens", help="the /metrics gauge of KV in use")
    g.add_argument("--ready-timeout", type=float, default=300.0)
    g.add_argument("--request-timeout", type=float, default=300.0, help="a request not done by then is an error")
    g = p.add_argument_group("load")
    g.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    g.add_argument("--concurrency", type=int, default=32, help="requests kept in flight (default 32)")
    g.add_argument("--abort-rate", type=float, default=0.1, help="share of requests hung up on (default 0.1)")
    g.add_argument("--stream-fraction", type=float, default=0.75, help="share sent with stream=true (default 0.75)")
    g.add_argument("--endpoints", default="completions,chat", help="mixed evenly (default completions,chat)")
    g.add_argument("--input-len", type=int, default=128, help="prompt tokens, mean (default 128)")
    g.add_argument("--output-len", type=int, default=40, help="max_tokens, mean (default 40)")
    g.add_argument("--range-ratio", type=float, default=0.6, help="lengths uniform in [L(1-r), L(1+r)] (default 0.6)")
    g.add_argument("--num-prompts", type=int, default=256, help="size of the prompt pool drawn from (default 256)")
    g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let answers end at EOS (their length is then not checked)")  # fmt: skip
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("sampling and verdict")
    g.add_argument("--sample-interval", type=float, default=5.0, help="seconds between samples (default 5)")
    g.add_argument("--warmup-s", type=float, default=None,
                   help="load left out of the memory check (default: a fifth of --duration, at most 60 s)")  # fmt: skip
    g.add_argument("--no-prewarm", dest="prewarm", action="store_false",
                   help="skip the round of one request per stream before the idle start sample")  # fmt: skip
    g.add_argument("--settle-timeout", type=float, default=30.0,
                   help="after the drain, how long KV and fds may take to come back (default 30 s)")  # fmt: skip
    g.add_argument("--rss-growth-limit-mib", type=float, default=64.0,
                   help="allowed RSS growth, last quarter's mean minus the first's (default 64 MiB)")  # fmt: skip
    g.add_argument("--fd-tolerance", type=int, default=4, help="allowed idle fd difference, end vs start (default 4)")
    g = p.add_argument_group("output")
    g.add_argument("--out", default="loadgen-results")
    g.add_argument("--label", default="soak")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no line per sample on stderr")


@asynccontextmanager
async def _server(a: argparse.Namespace, out_dir: Path) -> AsyncIterator[tuple[str, int | None]]:
    if a.base_url:
        yield a.base_url, a.server_pid
        return
    if a.server_pid is not None:
        raise SystemExit("--server-pid goes with --base-url")
    async with aserve_process(a.server_arg, out_dir / f"{a.label}_server.log") as server:
        yield server.base_url, server.pid


def _stop_soak(runner: SoakRunner) -> Callable[[str], str]:
    """The first SIGINT or SIGTERM ends the load early and the soak still drains, settles and
    writes its files; a second one cancels it outright (nothing is written)."""

    def stop(name: str) -> str:
        runner.stop()
        return f"{name}: load stopped at t={runner.stopped_at:.1f}s; draining (again to abandon)"

    return stop


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


async def cmd_soak(a: argparse.Namespace, argv: list[str]) -> int:
    endpoints = tuple(e.strip() for e in a.endpoints.split(",") if e.strip())
    if not endpoints or any(e not in ENDPOINTS for e in endpoints):
        raise SystemExit(f"--endpoints takes a comma list of {', '.join(ENDPOINTS)}")
    if not 0 <= a.abort_rate <= 1 or not 0 <= a.stream_fraction <= 1:
        raise SystemExit("--abort-rate and --stream-fraction are fractions in [0, 1]")
    spec = SoakSpec(
        duration=a.duration, concurrency=a.concurrency, warmup_s=a.warmup_s, sample_interval=a.sample_interval,
        prewarm=a.prewarm, settle_timeout=a.settle_timeout, fd_tolerance=a.fd_tolerance,
        rss_growth_limit_mib=a.rss_growth_limit_mib, seed=a.seed,
    )  # fmt: skip
    if spec.warmup >= spec.duration:
        raise SystemExit("--warmup-s must be shorter than --duration")
    mix = MixSpec(endpoints, a.stream_fraction, a.abort_rate, a.ignore_eos)
    out_dir = Path(a.out)
    await anyio.Path(out_dir).mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    async with _server(a, out_dir) as (base_url, pid):
        if pid is not None and sample_tree(pid) is None:
            raise SystemExit(f"no process {pid} to sample")
        target = HttpTarget(base_url, a.model or "", api_key=a.api_key)
        try:
            await target.wait_ready(a.ready_timeout)
            model = a.model or await target.served_model()
        finally:
            await target.aclose()
        tok = load_tokenizer(a.tokenizer or model)
        items = random_workload(tok, a.num_prompts, a.input_len, a.output_len, a.range_ratio, a.seed)

        def new_client() -> SoakClient:
            return SoakClient(base_url, model, tok, api_key=a.api_key, ignore_eos=a.ignore_eos,
                              request_timeout=a.request_timeout)  # fmt: skip

        probe = ServerProbe(base_url, pid=pid, api_key=a.api_key, kv_metric=a.kv_metric)
        runner = SoakRunner(new_client, probe, Mixer(items, mix, a.seed), spec, progress=a.progress)
        timeline: dict[str, Any] | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_on_signal, _stop_soak(runner), tg.cancel_scope, name="loadgen.soak.signals")
                timeline = await runner.run()
                tg.cancel_scope.cancel()
        finally:
            await probe.aclose()
    if timeline is None:
        raise SystemExit("soak abandoned by a second signal; nothing written")
    timeline["run"] = _meta(a, argv, base_url, pid, model, mix, started)
    timeline["verdict"] = verdict(timeline)
    files = {
        "json": out_dir / f"{a.label}.json",
        "png": out_dir / f"{a.label}.png",
        "table": out_dir / f"{a.label}_table.md",
    }
    timeline["files"] = {k: str(v) for k, v in files.items()}
    plots.soak_timeline(timeline, files["png"])
    write_markdown(timeline, files["table"])
    report.write_json(timeline, files["json"])
    print_report(timeline)
    Console().print(f"results in {out_dir}", highlight=False)
    return 0 if timeline["verdict"]["passed"] else 1


def _meta(
    a: argparse.Namespace, argv: list[str], base_url: str, pid: int | None, model: str, mix: MixSpec, started: str
) -> dict[str, Any]:
    return {
        "label": a.label,
        "command": "python -m loadgen " + " ".join(argv),
        "target": base_url,
        "launched_server_args": None if a.base_url else a.server_arg,
        "server_pid": pid,
        "model": model,
        "mix": {
            "endpoints": list(mix.endpoints),
            "stream_fraction": mix.stream_fraction,
            "abort_rate": mix.abort_rate,
            "ignore_eos": mix.ignore_eos,
        },
        "workload": {
            "input_len": a.input_len,
            "output_len": a.output_len,
            "range_ratio": a.range_ratio,
            "num_prompts": a.num_prompts,
            "seed": a.seed,
        },
        "started_at": started,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": sys.version.split()[0],
    }

"""``--client-procs K``: one run's requests sent from K client processes, merged into one result.

A single Python client tops out near 10k SSE events/s, below what a fast server streams. The
parent splits the workload round-robin into K shards (``--shard i/K``); each child runs
``python -m loadgen run`` on its shard with the rate and the concurrency divided by K (K
Poisson streams at rate/K are one Poisson stream at the rate). Records are put back on one
clock (every child's ``t0_perf_counter`` is ``time.perf_counter()``, one monotonic clock per
machine) and summarized as one run; the server's counters are read around the whole run.

The children start together: each opens its target, loads its tokenizer and builds its shard,
then marks itself ready (a file) and waits for a line on its stdin; the parent releases them all
at once when every one is ready. Without that barrier a child that loads its tokenizer a few
hundred milliseconds later sends its share late, and the run is stretched by the client's
start-up, not the server's pace (a 512-request run lasts about a second on a GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from loadgen import report
from loadgen.honesty import warnings
from loadgen.metrics import SLO, summarize
from loadgen.procstat import host_cpu_jiffies
from loadgen.records import RequestRecord
from loadgen.server_view import delta, parse_prometheus


def _child_args(argv: list[str], i: int, k: int, out: Path, label: str, a: argparse.Namespace) -> list[str]:
    """The parent's arguments for child ``i``: its shard, its share of the load (rate,
    concurrency, closed-loop users and warm-up requests divided by K), its own output."""
    rate, conc = a.rate, a.max_concurrency
    drop_value = {"--client-procs", "--out", "--label", "--rate", "--max-concurrency", "--shard", "--users", "--warmup"}
    args: list[str] = []
    skip = False
    for tok in argv:
        if skip:
            skip = False
            continue
        name = tok.split("=", 1)[0]
        if name in drop_value:
            skip = "=" not in tok
            continue
        if tok in ("--no-plots", "--no-progress"):
            continue
        args.append(tok)
    args += ["--shard", f"{i}/{k}", "--out", str(out), "--label", f"{label}_client{i}", "--no-plots", "--no-progress",
             "--rate", str(rate / k) if math.isfinite(rate) else "inf"]  # fmt: skip
    if conc is not None:
        args += ["--max-concurrency", str(max(1, math.ceil(conc / k)))]
    if a.users is not None:
        args += ["--users", str(max(1, math.ceil(a.users / k)))]
    if a.warmup:
        args += ["--warmup", str(math.ceil(a.warmup / k))]
    return args


def _release_together(procs: list[subprocess.Popen[bytes]], ready: list[Path], timeout_s: float) -> float | None:
    """Wait until every child has marked itself ready, then release them all and return the
    instant of release (``time.perf_counter()``). If one exits first, or the time is up, the
    others are stopped instead (a run without all its shards is no run) and None is returned."""
    deadline = time.monotonic() + timeout_s
    while not all(f.exists() for f in ready):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            return None
        time.sleep(0.002)
    t0 = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        try:
            p.stdin.write(b"go\n")
            p.stdin.close()
        except BrokenPipeError:
            pass  # that child is gone already; its exit code tells
    return t0


def _counters(base_url: str | None, api_key: str | None) -> dict[str, float] | None:
    if base_url is None:
        return None
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return parse_prometheus(httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, timeout=30).text)
    except httpx.HTTPError:
        return None


def run_fanout(a: argparse.Namespace, argv: list[str]) -> int:
    k = a.client_procs
    out = Path(a.out)
    shard_dir = out / f"{a.label}_clients"
    before = _counters(a.base_url, a.api_key)
    barrier = shard_dir / "ready"
    barrier.mkdir(parents=True, exist_ok=True)
    ready = [barrier / str(i) for i in range(k)]
    for f in ready:
        f.unlink(missing_ok=True)
    cmds = []
    for i in range(k):
        child = _child_args(argv, i, k, shard_dir, a.label, a)
        cmds.append([sys.executable, "-m", "loadgen", *child, "--start-barrier", str(ready[i])])
    # Each client in its own session: a terminal's Ctrl-C reaches this process only, which
    # passes it on once (a second one there would make a client give up its results).
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, start_new_session=True) for cmd in cmds]
    stopped = False
    try:
        t0 = _release_together(procs, ready, a.ready_timeout + 600)
        host0 = host_cpu_jiffies()
        while True:
            try:
                codes = [p.wait() for p in procs]
                break
            except KeyboardInterrupt:
                if stopped or t0 is None:
                    raise
                stopped = True  # the clients stop, write what they have, and exit
                print("SIGINT: client processes stopping; merging what they have (again to abandon)", file=sys.stderr)
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGINT)
    except BaseException:  # a second Ctrl-C, or the parent killed: no client keeps sending without it
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        raise
    if t0 is None:
        print(f"a client process ended before all were ready to send (exit codes {codes})", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    host1 = host_cpu_jiffies()
    after = _counters(a.base_url, a.api_key)
    if any(codes):
        print(f"client processes exited with {codes}", file=sys.stderr)
        return 1
    shards = [json.loads((shard_dir / f"{a.label}_client{i}.json").read_text()) for i in range(k)]
    start = min(s["run"]["t0_perf_counter"] for s in shards)
    records: list[RequestRecord] = []
    for i, s in enumerate(shards):
        shift = s["run"]["t0_perf_counter"] - start
        for line in (shard_dir / f"{a.label}_client{i}.jsonl").read_text().splitlines():
            r = RequestRecord.from_dict(json.loads(line))
            if r.warmup:
                continue
            r.index = i + k * r.index  # the request's index in the whole workload (child i sent every K-th)
            for name in ("scheduled_s", "ready_s", "send_s", "done_s"):
                v = getattr(r, name)
                if v is not None:
                    setattr(r, name, v + shift)
            r.chunk_s = [t + shift for t in r.chunk_s]
            records.append(r)
    records.sort(key=lambda r: r.send_s or 0.0)
    last = max((r.send_s or 0.0 for r in records), default=0.0)
    fixed_len = a.range_ratio == 0 and a.ignore_eos
    summary = summarize(records, SLO.parse(a.slo), last_send_s=last, expect_exact=bool(fixed_len))
    # The client's honesty is its slowest process's: that one's lags, every process's beside.
    views = [s["client"] for s in shards]
    worst = max(views, key=lambda v: v["loop_lag_s"].get("p99") or 0.0)
    cpu = sum(v["cpu_s"] for v in views)
    summary["client"] = {**worst, "client_bottleneck": any(v["client_bottleneck"] for v in views),
                         "processes": k, "per_process": views, "cpu_s": cpu,
                         # Cores the client processes kept busy over the run, all of them together.
                         "cores": cpu / summary["duration_s"] if summary["requests"]["completed"] else None}  # fmt: skip
    # The whole host's CPUs over the processes' lives from the release (client and server alike,
    # when both run here): near 1.0, the figure is the host's, not the server's.
    busy, total = host1[0] - host0[0], host1[1] - host0[1]
    summary["host"] = {"cpus": os.cpu_count(), "busy_fraction": busy / total if total else None}
    summary["server"] = delta(before, after)
    ready_at = [s["run"]["barrier"]["ready_perf"] for s in shards]
    stops = [s["run"]["stopped_at_s"] for s in shards if s["run"].get("stopped_at_s") is not None]
    # The run's load as asked of all the processes together (each shard holds its share).
    load = {**shards[0]["run"].get("load", {}), "rate": a.rate, "max_concurrency": a.max_concurrency,
            "users": a.users, "warmup": a.warmup}  # fmt: skip
    summary["run"] = {**shards[0]["run"], "label": a.label, "client_procs": k, "wall_s": wall, "load": load,
                      "shards": [s["run"]["label"] for s in shards],
                      # How far apart the processes were ready: what the barrier kept out of the run.
                      "ready_spread_s": max(ready_at) - min(ready_at),
                      "stopped_at_s": min(stops) if stops else None}  # fmt: skip
    summary["warnings"] = warnings(summary)
    out.mkdir(parents=True, exist_ok=True)
    report.write_jsonl(records, out / f"{a.label}.jsonl")
    report.write_json(summary, out / f"{a.label}.json")
    from rich.console import Console

    report.print_table(summary, Console())
    return 0

"""``python -m loadgen simulate``: the scale-out simulation over replica counts and policies.

Prints one table (throughput, hit rate, TTFT per policy and replica count) and writes it as
JSON. Workloads are loadgen's own (``--workload shared-prefix``, ``random``, or a ``trace``
replayed with its timestamps), built on a synthetic vocabulary: only token ids matter here.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aserve.routing.policy import POLICIES, Balance
from loadgen.arrivals import arrival_times
from loadgen.session import build_workload
from loadgen.simulate import CostModel, SimResult, SyntheticVocab, simulate
from loadgen.specs import workload_spec


def add_simulate_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("simulation")
    g.add_argument("--replicas", default="1,2,4,8,16,32,64", help="replica counts (default: %(default)s)")
    g.add_argument("--policies", default=",".join(POLICIES), help="routing policies (default: %(default)s)")
    g.add_argument("--groups-per-replica", type=int, default=None,
                   help="shared-prefix: scale the groups with the replicas (groups = this × N)")  # fmt: skip
    g.add_argument("--rate-per-replica", type=float, default=math.inf,
                   help="Poisson arrivals at this many requests/s per replica (default: inf, all at once); "
                   "a trace keeps its timestamps, compressed N times")  # fmt: skip
    g.add_argument("--balance-abs", type=float, default=Balance.abs)
    g.add_argument("--balance-rel", type=float, default=Balance.rel)
    c = CostModel()
    g.add_argument("--step-ms", type=float, default=c.step_s * 1e3, help="fixed cost of a step")
    g.add_argument("--prefill-us-per-token", type=float, default=c.prefill_token_s * 1e6)
    g.add_argument("--decode-us-per-seq", type=float, default=c.decode_seq_s * 1e6)
    g.add_argument("--max-batched-tokens", type=int, default=c.max_batched_tokens)
    g.add_argument("--max-running", type=int, default=c.max_running)
    g.add_argument("--kv-tokens", type=int, default=c.kv_tokens, help="one replica's KV pool in tokens")
    g.add_argument("--page-size", type=int, default=c.page)
    g.add_argument("--out", default="loadgen-results/simulate.json")


def cmd_simulate(a: argparse.Namespace) -> int:
    cost = CostModel(a.step_ms / 1e3, a.prefill_us_per_token / 1e6, a.decode_us_per_seq / 1e6,
                     a.max_batched_tokens, a.max_running, a.kv_tokens, a.page_size)  # fmt: skip
    balance = Balance(abs=a.balance_abs, rel=a.balance_rel)
    counts = [int(x) for x in a.replicas.split(",") if x.strip()]
    policies = [x.strip() for x in a.policies.split(",") if x.strip()]
    base = workload_spec(a)
    vocab = SyntheticVocab()
    results: list[SimResult] = []
    table = Table(title="scale-out simulation (router policies on simulated replicas)")
    for col in ("replicas", "policy", "requests", "output tok/s", "tok/s per replica", "hit rate", "TTFT p50 s",
                "TTFT p99 s", "sim wall s"):  # fmt: skip
        table.add_column(col, justify="right")
    for n in counts:
        spec = replace(base, groups=a.groups_per_replica * n) if a.groups_per_replica else base
        items = build_workload(spec, vocab)
        if items[0].timestamp is not None:
            arrivals = [(it.timestamp or 0.0) / n for it in items]
        else:
            arrivals = arrival_times(len(items), a.rate_per_replica * n, seed=spec.seed)
        for name in policies:
            t0 = time.perf_counter()
            res = simulate(items, arrivals, n, name, cost, balance)
            wall = time.perf_counter() - t0
            results.append(res)
            table.add_row(
                str(n), name, str(res.requests), f"{res.output_tok_per_s:,.0f}",
                f"{res.output_tok_per_s / n:,.0f}", f"{res.hit_rate:.1%}", f"{res.ttft_p50_s:.3f}",
                f"{res.ttft_p99_s:.3f}", f"{wall:.1f}",
            )  # fmt: skip
    Console(width=160).print(table)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "cost_model": asdict(cost),
        "balance": asdict(balance),
        "workload": dict(base.__dict__, groups_per_replica=a.groups_per_replica),
        "rate_per_replica": a.rate_per_replica if math.isfinite(a.rate_per_replica) else "inf",
        "results": [r.as_dict() for r in results],
    }
    out.write_text(json.dumps(doc, indent=2))
    Console().print(f"written to {out}")
    return 0

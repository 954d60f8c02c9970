"""Replicas on GPUs under Ray Serve: W3's saturated throughput with 1 and with 2 replicas.

    python -m aserve.bench.ray_scale --out ray_scale.json [--replicas 1,2] [--rates 128,256]
        [--ingress-replicas 4] [--client-procs 4] [--model DIR]

Needs ``pip install "aserve[ray]"`` and one GPU per replica. For each replica count it starts
``aserve serve --ray --replicas N --gpus-per-replica 1`` (a local Ray cluster of this machine),
then runs W3 through it: ``loadgen``, Poisson arrivals, 200 requests (``--w3-requests``) of
256 token-id prompt tokens and 256 output tokens, streamed, at each rate. The issue's mark:
2 replicas on 2 GPUs give at least 1.8x one replica's saturated throughput (the best rate
of each). Random weights in the Gemma 3 270M shape unless ``--model`` names a checkpoint.
Prints a table, writes JSON.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aserve.bench.served import _loadgen, _model_path, _port, _row, _wait_ready, bench_parser


def main() -> int:
    ap = bench_parser(__doc__, "ray_scale.json")
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--rates", default="128,256", help="W3 Poisson rates, req/s")
    ap.add_argument("--w3-requests", type=int, default=200)
    ap.add_argument("--len", type=int, default=256, help="prompt and output length")
    ap.add_argument("--ingress-replicas", type=int, default=4)
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--routing", default="prefix")
    ap.add_argument("--server-arg", action="append", default=[])
    a = ap.parse_args()
    work = Path(a.work_dir)
    runs = work / "ray-scale-runs"
    runs.mkdir(parents=True, exist_ok=True)
    path = _model_path(a.model, work, a.tokenizer_dir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
                              "model": str(path), "rows": rows}  # fmt: skip

    def save() -> None:
        Path(a.out).write_text(json.dumps(result, indent=1))

    for n in [int(x) for x in a.replicas.split(",") if x.strip()]:
        port = _port()
        base = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "aserve", "serve", "--ray", "--replicas", str(n), "--gpus-per-replica", "1",
               "--ingress-replicas", str(a.ingress_replicas), "--routing", a.routing, "--model", str(path),
               "--port", str(port), "--served-model-name", "bench", "--device", "cuda", *a.server_arg]  # fmt: skip
        log_path = runs / f"server_r{n}.log"
        with open(log_path, "wb") as log:
            server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                _wait_ready(base, server, log_path, timeout_s=900)
                for rate in [float(r) for r in a.rates.split(",") if r.strip()]:
                    label = f"w3_replicas{n}_rate{rate:g}"
                    s = _loadgen(["--base-url", base, "--model", "bench", "--ready-timeout", "900", "--workload",
                                  "random", "--num-requests", str(a.w3_requests), "--input-len", str(a.len),
                                  "--output-len", str(a.len), "--seed", "2", "--tokenizer", str(path), "--rate",
                                  str(rate), "--client-procs", str(a.client_procs)], runs, label, env)  # fmt: skip
                    rows.append({"replicas": n, "rate": rate, **_row(label, s)})
                    save()
            finally:
                server.terminate()
                server.wait(timeout=300)
    best: dict[int, float] = {}
    for r in rows:
        best[r["replicas"]] = max(best.get(r["replicas"], 0.0), r["output_tok_s"])
        print(f"replicas={r['replicas']} rate={r['rate']:g}: {r['output_tok_s']:,.0f} tok/s, failed {r['failed']}, "
              f"TTFT p50/p99 {r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms")  # fmt: skip
    if 1 in best and 2 in best:
        result["speedup_2_vs_1"] = best[2] / best[1]
        print(f"2 replicas / 1 replica, saturated: {best[2] / best[1]:.2f}x (the issue asks >= 1.8x)")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

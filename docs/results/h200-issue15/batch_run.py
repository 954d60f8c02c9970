"""Decode runs at batch 64/256/512 with whichever aserve is on PYTHONPATH (before/after)."""
import json, sys
from pathlib import Path
from aserve.bench.throughput import run_throughput
out = []
for b in (64, 256, 512):
    r = run_throughput("gemma3-270m", Path("/tmp/aserve-bench"), Path(sys.argv[2]), "cuda", "bfloat16", b, 128, 512, True, b, {})
    r.pop("steady_by_quarter", None); r.pop("slowest_launches", None)
    host = 1e3 * (r["host_plan_ms_per_step"] + r["host_launch_ms_per_step"] + r["host_commit_ms_per_step"])
    print(f"b={b} tok/s={r['output_tok_s']:.0f} idle={100*r['steady_decode_idle_fraction']:.1f}% gap_p50={r['median_decode_gap_us']:.1f}us busy={r['median_step_busy_ms']:.2f}ms plan/launch/commit={r['host_plan_ms_per_step']:.3f}/{r['host_launch_ms_per_step']:.3f}/{r['host_commit_ms_per_step']:.3f}ms host_us_per_req={host/b:.2f}", flush=True)
    out.append(r)
Path(sys.argv[1]).write_text(json.dumps(out, indent=1))

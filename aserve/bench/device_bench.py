"""Engine checks and timings on random weights in real model shapes (meant for the GPU machine).

    python -m aserve.bench.device_bench --out results.json [--tiny] [--device cuda] [--only parity,bf16,w2]
    python -m aserve.bench.device_bench --only copy,w1,floor,w3 --attention-backend triton   # issue 6

* copy/w1/floor/w3: see ``aserve/bench/gpu_workloads.py`` (W1 offline vs transformers
  ``generate_batch``, the decode-step floor, W3 through the HTTP server at three rates).
* ops: each fused Triton kernel vs the eager ops it replaces vs ``torch.compile`` of them.

* parity: float32, the engine's greedy tokens vs transformers' on the same random weights.
* bf16:   the engine in bfloat16 on both shapes (a short batched run; tokens/s).
* w2:     decode-heavy: 64 requests x 128 prompt tokens x 1024 output tokens (Gemma 3 270M
          shape, bfloat16, ignore_eos), overlap on vs off: throughput and the engine's own
          device-gap figures.

Prompts are token ids; weights come from transformers' own initialisation (seeded).
The tokenizer directory must hold a ``tokenizer.model`` whose vocabulary covers the shapes'
(the Gemma 3 vocabulary does: 262144 ids).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

import aserve
from aserve.bench import gpu_workloads as gw
from aserve.bench.checkpoints import SHAPES, build_checkpoint, check_parity
from aserve.bench.throughput import profile_device, profile_host, run_throughput
from aserve.bench.wakeup import bench_wakeup

# This module is the driver: options, the sections in order, the JSON and the summary table.
# The sections live in checkpoints.py (shapes, checkpoints, parity), throughput.py (bf16, w2,
# profile, kprofile), wakeup.py (wake) and gpu_workloads.py (copy, w1, floor, w3, ops).


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="device_bench.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokenizer-dir", default=".gpu")
    ap.add_argument("--work-dir", default="/tmp/aserve-bench")
    ap.add_argument("--tiny", action="store_true", help="tiny stand-in shapes and sizes (CPU smoke run)")
    ap.add_argument(
        "--only",
        default="wake,parity,bf16,w2",
        help="comma list of: wake, parity, bf16, w2, copy, w1, floor, batch, structured, w3, ops, profile, kprofile",
    )
    ap.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    ap.add_argument(
        "--engine-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra aserve.Engine option for every aserve run, e.g. cuda_graph=true (repeatable)",
    )
    ap.add_argument("--w1-requests", type=int, default=1000)
    ap.add_argument("--w1-shapes", default="gemma,llama", help="which shapes W1 runs, a comma list of gemma and llama")
    ap.add_argument("--w1-peer-requests", type=int, default=0,
                    help="transformers runs this many of the W1 requests (0: as many as aserve's max_running_requests)")  # fmt: skip
    ap.add_argument("--batches", default="64,256,512", help="the 'batch' section's decode batch sizes")
    ap.add_argument(
        "--batch-shapes", default="gemma", help="the 'batch' section's shapes, a comma list of gemma and llama"
    )
    ap.add_argument("--profile-batch", type=int, default=64, help="requests at once in the 'profile' run")
    ap.add_argument("--structured-repeats", type=int, default=1,
                    help="free and constrained runs per batch size, taking turns; the ratio is the median pair's")  # fmt: skip
    args = ap.parse_args()
    only = set(args.only.split(","))
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run in the interpreter there
    opts: dict[str, Any] = {"attention_backend": args.attention_backend, **gw.parse_engine_opts(args.engine_opt)}
    root, tok = Path(args.work_dir), Path(args.tokenizer_dir)
    g, ll = ("tiny-gemma3", "tiny-llama") if args.tiny else ("gemma3-270m", "llama3.2-1b")

    def shapes(spec: str) -> list[str]:
        """The shapes a comma list of ``gemma`` and ``llama`` names, in that order."""
        return [s for key, s in (("gemma", g), ("llama", ll)) if key in spec.split(",")]

    bf16 = "bfloat16" if args.device == "cuda" else "float32"
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "device": args.device, "torch": torch.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
        "driver": _driver(), "aserve": aserve.__version__, "engine_opts": opts,
    }  # fmt: skip
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 parity must be float32

    def save() -> None:  # after every section, so a run cut short keeps what it measured
        Path(args.out).write_text(json.dumps(results, indent=1))

    if "wake" in only and args.device == "cuda":
        results["wake"] = bench_wakeup()
        print(json.dumps(results["wake"]), flush=True)
        save()
    if "parity" in only:
        results["parity"] = [check_parity(s, root, tok, args.device, 16 if args.tiny else 24, opts) for s in (g, ll)]
        print(json.dumps(results["parity"]), flush=True)
        save()
    if "bf16" in only:
        results["bf16"] = [
            run_throughput(s, root, tok, args.device, bf16, 8 if args.tiny else 32, 64, 16 if args.tiny else 128, True, 256, opts)
            for s in (g, ll)
        ]  # fmt: skip
        print(json.dumps(results["bf16"]), flush=True)
        save()
    if "w2" in only:
        n, plen, olen = (8, 32, 48) if args.tiny else (64, 128, 1024)
        results["w2"] = [
            run_throughput(g, root, tok, args.device, bf16, n, plen, olen, ov, 256, opts)
            for ov in (True, False, True, False)
        ]
        print(json.dumps(results["w2"]), flush=True)
        save()
    if "copy" in only or "floor" in only:
        results["copy_bytes_per_s"] = gw.copy_bandwidth(args.device, nbytes=2**24 if args.tiny else 2 * 2**30)
        print(f"copy bandwidth (read + write): {results['copy_bytes_per_s'] / 1e12:.3f} TB/s", flush=True)
        save()
    if "w1" in only:
        results["w1"] = []
        for shape in shapes(args.w1_shapes):
            path = root / shape
            if not (path / "config.json").exists():
                build_checkpoint(shape, root, tok)
            lo, hi = (8, 24) if args.tiny else (128, 1024)
            reqs = gw.w1_requests(args.w1_requests, lo, hi, SHAPES[shape]["vocab_size"], seed=4)
            ours = gw.w1_aserve(path, reqs, args.device, bf16, opts)
            # The peer gets at least as many requests at once as aserve runs at once.
            peer_reqs = reqs[: max(args.w1_peer_requests, ours["max_running_requests"])]
            _, hf = build_checkpoint(shape, root / "peer", tok)  # same seed: the same weights
            hf = hf.to(device=args.device, dtype=getattr(torch, bf16))
            peer = gw.w1_transformers(hf, peer_reqs)
            del hf
            row = {
                "shape": shape,
                "aserve": ours,
                "transformers": peer,
                "ratio": ours["output_tok_s"] / peer["output_tok_s"],
            }
            results["w1"].append(row)
            print(json.dumps(row), flush=True)
            save()
    if "floor" in only:
        results["floor"] = []
        for shape in (g, ll):
            path = root / shape
            if not (path / "config.json").exists():
                build_checkpoint(shape, root, tok)
            batch, ctx = (8, 64) if args.tiny else (256, 1024)
            spec = {k: v for k, v in SHAPES[shape].items() if k != "arch"}
            floor = gw.decode_floor(spec, batch, ctx, results["copy_bytes_per_s"], 4 if bf16 == "float32" else 2)
            span, replay = gw.decode_step_time(path, batch, ctx, args.device, bf16, opts)
            step = span if replay is None else replay  # the device's own time when there is a graph
            results["floor"].append({"shape": shape, "batch": batch, "context": ctx, "floor_ms": floor * 1e3,
                                     "step_ms": step * 1e3, "step_span_ms": span * 1e3,
                                     "step_replay_ms": None if replay is None else replay * 1e3,
                                     "step_over_floor": step / floor})  # fmt: skip
            print(json.dumps(results["floor"][-1]), flush=True)
            save()
    if "batch" in only:
        # Decode-heavy runs at each batch size (128 prompt, 512 output tokens, all at once):
        # device idle, decode gap and the host's plan / launch / commit per request per step.
        plen, olen = (16, 24) if args.tiny else (128, 512)
        results["batch"] = [
            run_throughput(shape, root, tok, args.device, bf16, b, plen, olen, True, b, opts)
            for shape in shapes(args.batch_shapes)
            for b in (int(x) for x in args.batches.split(","))
        ]
        print(json.dumps(results["batch"]), flush=True)
        save()
    if "structured" in only:
        # Decode with every request constrained by a JSON schema that never completes within
        # the output length (so both runs make the same tokens), against the same run free.
        plen, olen = (16, 24) if args.tiny else (128, 256)
        never_done = aserve.StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
        results["structured"] = []
        from aserve.sampling import grammar
        from aserve.sampling.masks import MaskFiller

        # How the masks were filled: the strategy (ASERVE_MASK_FILL) and whether llguidance
        # called the C tokenizer table (the pool needs it; see aserve/bench/mask_fill.py).
        c_tokens = grammar._native_tokens() is not None and os.environ.get("ASERVE_GRAMMAR_TOKENS") != "python"
        filler = MaskFiller.for_device("cuda" if args.device == "cuda" else "cpu")  # the engine's
        results["mask_fill"] = {"spec": filler.spec, "c_tokens": c_tokens}
        for b in (int(x) for x in args.batches.split(",")):
            # Runs of one build vary by more than a change's effect on these hosts (the twelfth
            # session's H100 calls): repeats, taking turns, give the ratio's spread.
            pairs = []
            for _ in range(max(1, args.structured_repeats)):
                free = run_throughput(g, root, tok, args.device, bf16, b, plen, olen, True, b, opts)
                bound = run_throughput(g, root, tok, args.device, bf16, b, plen, olen, True, b, opts,
                                       structured=never_done)  # fmt: skip
                pairs.append((bound["output_tok_s"] / free["output_tok_s"], free, bound))
            ratios = [r for r, _, _ in pairs]
            ratio, free, bound = sorted(pairs, key=lambda p: p[0])[len(pairs) // 2]
            # The decode alone (both runs' identical prefills left out, which pull the ratio
            # toward 1): the same pairs' steady-state decode rates.
            steady = sorted(b["steady_decode_tok_s"] / f["steady_decode_tok_s"] for _, f, b in pairs
                            if b["steady_decode_tok_s"] and f["steady_decode_tok_s"])  # fmt: skip
            row = {
                "batch": b,
                "free": free,
                "json_schema": bound,
                "ratio": ratio,  # the median pair's (its runs are ``free`` and ``json_schema``)
                "ratios": ratios,
                "steady_decode_ratio": steady[len(steady) // 2] if steady else None,  # the pairs' median
                "steady_decode_ratios": steady,
                "free_tok_s": [p[1]["output_tok_s"] for p in pairs],
                "json_schema_tok_s": [p[2]["output_tok_s"] for p in pairs],
            }
            results["structured"].append(row)
            spread = f" (runs {min(ratios):.2f}-{max(ratios):.2f}x)" if len(ratios) > 1 else ""
            print(f"structured b={b}: {bound['output_tok_s']:.0f} vs {free['output_tok_s']:.0f} tok/s "
                  f"= {row['ratio']:.2f}x{spread}, busy {bound['device_busy_fraction']:.1%} vs "
                  f"{free['device_busy_fraction']:.1%}; decode alone {row['steady_decode_ratio'] or 0:.2f}x; "
                  f"step busy {bound.get('median_step_busy_ms') or 0:.2f} vs {free.get('median_step_busy_ms') or 0:.2f} ms; "
                  f"steady idle {bound.get('steady_decode_idle_fraction') or 0:.1%}", flush=True)  # fmt: skip
            save()
    if "w3" in only:
        path = root / g
        if not (path / "config.json").exists():
            build_checkpoint(g, root, tok)
        out_dir = Path(args.out).parent / "w3"
        out_dir.mkdir(parents=True, exist_ok=True)
        rates = [8.0, 32.0, 128.0] if not args.tiny else [4.0, 16.0, 64.0]
        n, il, ol = (12, 8, 4) if args.tiny else (200, 256, 256)
        results["w3"] = gw.w3_online(path, rates, n, il, ol, out_dir, ["--dtype", bf16, *gw.cli_flags(opts)])
        print(json.dumps(results["w3"]), flush=True)
        save()
    if "ops" in only:
        results["ops"] = gw.small_op_compare(args.device, bf16, [8, 64] if args.tiny else [64, 256], not args.tiny)
        save()
    if "profile" in only:
        # With "structured" also asked for, the profiled run is the constrained one.
        profiled = aserve.StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA) if "structured" in only else None
        results["profile"] = profile_host(
            g, root, tok, args.device, bf16, opts, structured=profiled, batch=args.profile_batch
        )
        print(results["profile"], flush=True)
        save()
    if "kprofile" in only:
        results["kprofile"] = profile_device(g, root, tok, args.device, bf16, opts)
        print(results["kprofile"], flush=True)
        save()
    save()
    _table(results)


# An array of 200 bounded integers: at 256 output tokens the grammar is never complete, so a
# constrained request makes exactly as many tokens as an unconstrained one.
STRUCTURED_BENCH_SCHEMA = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 999},
    "minItems": 200,
    "maxItems": 200,
}


def _driver() -> str | None:
    try:
        import subprocess

        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or None  # fmt: skip
    except Exception:
        return None


def _table(results: dict[str, Any]) -> None:
    if "copy_bytes_per_s" in results:
        print(f"copy bandwidth (read + write): {results['copy_bytes_per_s'] / 1e12:.3f} TB/s")
    for r in results.get("w1", []):
        print(
            f"W1 {r['shape']:>12}: aserve {r['aserve']['output_tok_s']:.0f} tok/s ({r['aserve']['requests']} req), "
            f"transformers {r['transformers']['output_tok_s']:.0f} tok/s ({r['transformers']['requests']} req): "
            f"{r['ratio']:.1f}x; running {r['aserve'].get('max_running_requests')}, idle "
            f"{100 * (r['aserve'].get('device_idle_fraction') or 0):.1f}%, gap p50 {r['aserve'].get('median_decode_gap_us')} us"
        )
    for f in results.get("floor", []):
        print(f"decode step {f['shape']} b={f['batch']} ctx={f['context']}: {f['step_ms']:.2f} ms "
              f"(run's median span {f.get('step_span_ms', f['step_ms']):.2f} ms), "
              f"floor {f['floor_ms']:.2f} ms ({f['step_over_floor']:.2f}x)")  # fmt: skip
    for r in results.get("w3", []):
        print(f"W3 rate {r['rate']:>5}: {r['output_tok_s']:.0f} tok/s, TTFT p50/p99 {r['ttft_p50_ms']:.0f}/"
              f"{r['ttft_p99_ms']:.0f} ms, TPOT {r['tpot_p50_ms']:.1f}/{r['tpot_p99_ms']:.1f}, "
              f"ITL {r['itl_p50_ms']:.1f}/{r['itl_p99_ms']:.1f}")  # fmt: skip
    for w in results.get("wake", []):
        print(
            f"wake {w['strategy']:>16}: p50 {w['median_wake_latency_us']:.1f} us, max {w['max_wake_latency_us']:.1f} us, "
            f"CPU {w['cpu_s_per_wall_s']:.2f} s per s waited"
        )
    for p in results.get("parity", []):
        print(
            f"parity {p['shape']:>12}: {p['exact_match']}/{p['requests']} exact; first divergence {p['first_divergence']}"
        )
    print(
        f"{'run':>40} {'tok/s':>9} {'gap p50 us':>10} {'idle%':>6} {'busy ms':>8} {'plan':>6} {'launch':>6} {'commit':>6} "
        f"{'us/req':>6} {'gc2 n/ms':>9}"
    )
    for key in ("bf16", "w2", "batch"):
        for r in results.get(key, []):
            name = f"{key} {r['shape']} {'overlap' if r['overlap'] else 'serial'} b={r['requests']}"
            gap = r["median_decode_gap_us"]
            idle = r["steady_decode_idle_fraction"]
            full = r.get("gc_pauses", {}).get("gen2", {"count": 0, "total_ms": 0.0})
            host_us = 1e3 * (r["host_plan_ms_per_step"] + r["host_launch_ms_per_step"] + r["host_commit_ms_per_step"])
            print(
                f"{name:>40} {r['output_tok_s']:9.1f} {gap if gap is None else round(gap, 1)!s:>10} "
                f"{'-' if idle is None else round(100 * idle, 2)!s:>6} {r['median_step_busy_ms'] or 0:8.2f} "
                f"{r['host_plan_ms_per_step']:6.2f} {r['host_launch_ms_per_step']:6.2f} {r['host_commit_ms_per_step']:6.2f} "
                f"{host_us / r['requests']:6.2f} "
                f"{full['count']:>3}/{full['total_ms']:<5.1f}"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

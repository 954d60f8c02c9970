"""W1 with prefill/mixed-step CUDA graphs (the default now) against decode graphs only
(cuda_graph_max_tokens=0), same requests, same call; steps by kind from the engine's records."""
import json, statistics, sys, time
from pathlib import Path
import anyio
import aserve
from aserve.bench import gpu_workloads as gw
from aserve.bench.checkpoints import SHAPES, build_checkpoint

root, tok = Path("/tmp/aserve-bench"), Path(".gpu")
shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["gemma3-270m", "llama3.2-1b"]
nreq = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
device = "cuda"


def kinds(recs):
    out = {}
    for kind, sel in (("decode", lambda r: r.num_decodes == r.num_seqs), ("with_prefill", lambda r: r.num_decodes < r.num_seqs)):
        rs = [r for r in recs if sel(r)]
        if not rs:
            continue
        out[kind] = {"steps": len(rs), "busy_s": sum(r.device_busy_s for r in rs),
                     "gap_s": sum(r.device_gap_s or 0 for r in rs),
                     "launch_ms_p50": statistics.median(r.launch_s for r in rs) * 1e3,
                     "busy_ms_p50": statistics.median(r.device_busy_s for r in rs) * 1e3,
                     "tokens_p50": statistics.median(r.num_tokens for r in rs)}
    return out


async def run(path, reqs, opts):
    ctx = max(len(p) + o for p, o in reqs) + 8
    t_start = time.perf_counter()
    async with aserve.Engine(model=str(path), device=device, max_context=ctx, **opts) as e:
        start_s = time.perf_counter() - t_start
        e.reset_stats()
        t0 = time.perf_counter()
        total = 0

        async def one(p, o):
            nonlocal total
            r = await e.complete(p, aserve.SamplingParams(max_tokens=o, temperature=0, ignore_eos=True))
            total += len(r.token_ids)

        async with anyio.create_task_group() as tg:
            for p, o in reqs:
                tg.start_soon(one, p, o)
        wall = time.perf_counter() - t0
        st = e.stats()
        recs = e.step_records()
        xg = e.runner.extend_graphs
        span = st.device_busy_s + st.device_gap_s
        return {"opts": opts, "start_s": start_s, "wall_s": wall, "output_tok_s": total / wall,
                "device_idle": st.device_gap_s / span if span else None,
                "prefill_graph_runs": 0 if xg is None else xg.runs,
                "prefill_graph_sizes": None if xg is None else xg.sizes, "by_kind": kinds(recs)}


configs = {"graphs": {}, "decode-only": {"cuda_graph_max_tokens": 0}}
only = sys.argv[4] if len(sys.argv) > 4 else None
results = json.loads(Path(sys.argv[1]).read_text()) if Path(sys.argv[1]).exists() else []
for shape in shapes:
    path = root / shape
    if not (path / "config.json").exists():
        build_checkpoint(shape, root, tok)
    reqs = gw.w1_requests(nreq, 128, 1024, SHAPES[shape]["vocab_size"], seed=4)
    for name, opts in configs.items():
        if only and name != only:
            continue
        r = anyio.run(run, path, reqs, opts)
        r["shape"] = shape
        results.append(r)
        print(f"{shape} {opts}: {r['output_tok_s']:.0f} tok/s wall {r['wall_s']:.2f}s idle {r['device_idle']:.1%} "
              f"start {r['start_s']:.1f}s xruns {r['prefill_graph_runs']} {json.dumps(r['by_kind'])}", flush=True)
        Path(sys.argv[1]).write_text(json.dumps(results, indent=1))

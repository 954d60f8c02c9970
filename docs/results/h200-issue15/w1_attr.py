"""W1 (Gemma shape, defaults): where the device idles -- by step kind (decode-only vs with prefill)."""
import json, statistics, sys, time
from pathlib import Path
import anyio
import aserve
from aserve.bench import gpu_workloads as gw
from aserve.bench.checkpoints import SHAPES, build_checkpoint
root, tok = Path("/tmp/aserve-bench"), Path(".gpu")
path = root / "gemma3-270m"
if not (path / "config.json").exists():
    build_checkpoint("gemma3-270m", root, tok)
reqs = gw.w1_requests(1000, 128, 1024, SHAPES["gemma3-270m"]["vocab_size"], seed=4)
PROFILE = "--profile-mixed" in sys.argv
prof = None
if PROFILE:
    import cProfile, pstats
    from aserve.device.runner import ModelRunner
    prof = cProfile.Profile()
    real = ModelRunner.launch
    def launch(self, plan, plan_s=0.0):
        if plan.num_decodes < len(plan.seqs):
            prof.enable()
            try:
                return real(self, plan, plan_s)
            finally:
                prof.disable()
        return real(self, plan, plan_s)
    ModelRunner.launch = launch
async def run():
    ctx = max(len(p) + o for p, o in reqs) + 8
    async with aserve.Engine(model=str(path), device="cuda", max_context=ctx) as e:
        e.reset_stats()
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for p, o in reqs:
                tg.start_soon(e.complete, p, aserve.SamplingParams(max_tokens=o, temperature=0, ignore_eos=True))
        wall = time.perf_counter() - t0
        return wall, e.step_records()
wall, recs = anyio.run(run)
out = {"wall_s": wall, "steps": len(recs)}
for kind, sel in (("decode", lambda r: r.num_decodes == r.num_seqs), ("mixed", lambda r: r.num_decodes < r.num_seqs)):
    rs = [r for r in recs if sel(r)]
    busy = sum(r.device_busy_s for r in rs); gap = sum(r.device_gap_s or 0 for r in rs)
    out[kind] = {"steps": len(rs), "busy_s": busy, "gap_s": gap,
                 "launch_ms_p50": statistics.median(r.launch_s for r in rs) * 1e3 if rs else None,
                 "plan_ms_p50": statistics.median(r.plan_s for r in rs) * 1e3 if rs else None,
                 "commit_ms_p50": statistics.median(r.commit_s for r in rs) * 1e3 if rs else None,
                 "busy_ms_p50": statistics.median(r.device_busy_s for r in rs) * 1e3 if rs else None,
                 "tokens_p50": statistics.median(r.num_tokens for r in rs) if rs else None,
                 "seqs_p50": statistics.median(r.num_seqs for r in rs) if rs else None}
# the tail: steps with fewer than 64 sequences
tail = [r for r in recs if r.num_seqs < 64]
out["small_batch_steps"] = {"steps": len(tail), "gap_s": sum(r.device_gap_s or 0 for r in tail), "busy_s": sum(r.device_busy_s for r in tail)}
print(json.dumps(out, indent=1))
if prof is not None:
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
Path(sys.argv[1]).write_text(json.dumps(out, indent=1))

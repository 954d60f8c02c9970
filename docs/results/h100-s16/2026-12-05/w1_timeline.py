"""W1 (Gemma shape, defaults): a per-step host/device timeline, to attribute device idle.
usage: w1_timeline.py out.json [--profile-mixed]"""
import json, os, statistics, sys, time
from pathlib import Path
import anyio
import aserve
from aserve.bench import gpu_workloads as gw
from aserve.bench.checkpoints import SHAPES, build_checkpoint
from aserve.engine.recorder import StepRecorder
root, tok = Path("/tmp/aserve-bench"), Path(".gpu")
shape = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else "gemma3-270m"
path = root / shape
if not (path / "config.json").exists():
    build_checkpoint(shape, root, tok)
N = int(os.environ.get("N", 1000)); LO, HI = (8, 24) if N < 100 else (128, 1024)
reqs = gw.w1_requests(N, LO, HI, SHAPES[shape]["vocab_size"], seed=4)
rows = []
real_record = StepRecorder.record
def record(self, step, commit_s, commit_t0):
    rows.append(dict(i=step.index, seqs=step.num_seqs if hasattr(step, 'num_seqs') else len(step.entries), tok=step.num_tokens, dec=step.num_decodes,
                     depth=step.depth_in_use, t_launch=step.launch_time, launch_s=step.launch_s, plan_s=step.plan_s,
                     d_begin=self.device_clock(step.forward_begin), d_end=self.device_clock(step.materialized),
                     t_commit=commit_t0, commit_s=commit_s, after_idle=step.after_idle))
    return real_record(self, step, commit_s, commit_t0)
StepRecorder.record = record
prof = None
if "--profile" in sys.argv:
    import cProfile, pstats
    prof = cProfile.Profile()
async def run():
    ctx = max(len(p) + o for p, o in reqs) + 8
    async with aserve.Engine(model=str(path), device=os.environ.get("DEV", "cuda"), max_context=ctx) as e:
        e.reset_stats(); rows.clear()
        t0 = time.perf_counter()
        if prof: prof.enable()
        async with anyio.create_task_group() as tg:
            for p, o in reqs:
                tg.start_soon(e.complete, p, aserve.SamplingParams(max_tokens=o, temperature=0, ignore_eos=True))
        if prof: prof.disable()
        wall = time.perf_counter() - t0
        st = e.stats()
        return wall, t0, st
wall, t0, st = anyio.run(run)
toks = sum(o for _, o in reqs)
span = st.device_busy_s + st.device_gap_s
print(f"{shape}: {toks / wall:.0f} tok/s wall {wall:.2f}s idle {st.device_gap_s / span:.1%} steps {len(rows)}")
for kind, sel in (("decode", [r for r in rows if r["tok"] == r["dec"]]), ("mixed", [r for r in rows if r["tok"] > r["dec"]])):
    if sel:
        med = lambda k: statistics.median(r[k] for r in sel) * 1e3
        dev = statistics.median(r["d_end"] - r["d_begin"] for r in sel) * 1e3
        print(f"  {kind:>6} steps {len(sel):5d}  plan {med('plan_s'):.3f}  launch {med('launch_s'):.3f}  commit {med('commit_s'):.3f}  device {dev:.3f} ms")
Path(sys.argv[1]).write_text(json.dumps({"shape": shape, "wall_s": wall, "t0": t0, "tok_s": toks / wall,
                                          "idle": st.device_gap_s / span, "steps": rows}))
if prof is not None:
    pstats.Stats(prof).sort_stats("tottime").print_stats(40)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)

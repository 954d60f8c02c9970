"""An 8192-token prefill step on the host (256 prompts of 256 tokens, budget 8192; the real
planner, input build and committer, no device): medians of plan / inputs / commit over the
first 8 steps of 12 fresh schedulers. Runs on either tree (HEAD or c3d5801):
    PYTHONPATH=<tree> python prefill_steps.py"""
import aserve, time, statistics, anyio, torch, sys
from aserve.bench.host_step import _host_parts, _CFG
from aserve.device.inputs import build_inputs
from aserve.device.extend_graphs import ExtendGraphs
from aserve.device.events import DeviceEvent
from aserve.device.step import StepOutputs
from aserve.engine.cell import OutputCell
from aserve.sampling_params import SamplingParams
from aserve.scheduler.req import Req
import random, cProfile, pstats
async def main():
    res = []
    prof = cProfile.Profile() if "--prof" in sys.argv else None
    for trial in range(12):
        pool, sched, graphs, runner, committer = _host_parts(256, 1024, radix_cache=True)
        xg = ExtendGraphs(torch.nn.Identity(), pool, torch.device("cpu"), 8192, 256, _CFG.vocab_size)
        rnd = random.Random(trial)
        for i in range(256):
            r = Req(rid=f"r{i}", index=0, prompt_ids=[rnd.randrange(2, 64) for _ in range(256)], params=SamplingParams(max_tokens=256, temperature=0, ignore_eos=True), max_new_tokens=256, seed=0, stop_ids=frozenset())
            r.cell = OutputCell(wake_every=0); sched.add(r)
        done = DeviceEvent("d"); done._complete()
        for k in range(8):
            if prof: prof.enable()
            t0 = time.perf_counter(); plan = sched.schedule(False); t1 = time.perf_counter()
            host = build_inputs(plan, graphs, xg); step = runner._step(k, plan, done, done, done, [host]); t2 = time.perf_counter()
            step.outputs = StepOutputs(token_ids=[7] * len(plan.reqs() if hasattr(plan, "reqs") else plan.seqs))
            for r in (plan.reqs() if hasattr(plan, "reqs") else [s.req for s in plan.seqs]): r.inflight += 1
            t3 = time.perf_counter(); committer.commit(step); t4 = time.perf_counter()
            if prof: prof.disable()
            res.append((t1-t0, t2-t1, t4-t3, plan.num_tokens))
    print("prefill steps: plan %.0f us, inputs %.0f us, commit %.0f us (tokens %d)" % tuple([statistics.median(r[i] for r in res)*1e6 for i in range(3)] + [res[0][3]]))
    if prof: pstats.Stats(prof).sort_stats("tottime").print_stats(12)
anyio.run(main)

"""The host's share of one decode step at batch 64 / 256 / 512, measured without a device.

    python -m aserve.bench.host_step --out host_step.json [--batches 64,256,512]
    python -m aserve.bench.host_step --mixed --out host_mixed.json   # W1-like mixed steps
    python -m aserve.bench.host_step --constrained --out host_json.json  # a JSON schema's rows (commit: advance + rest)
    python -m aserve.bench.host_step --constrained --automata --out host_fsm.json  # the same rows by its token automaton (no host fill)

One steady greedy decode step is, on the host: ``Scheduler.schedule()`` (plan),
``build_inputs`` on the CUDA-graph fast path plus the step's snapshot of its sequences
(the host part of launch), and ``Committer.commit`` with the step's sampled tokens (commit).
Here each piece runs for real (the scheduler, the decode-graph ladder, the committer and the
output cells) with the device work left out, so the figure is what the event loop spends per
step, and per request per step, however fast the device is. On the GPU the engine's own
counters (``host_plan_s``, ``host_launch_s``, ``host_commit_s``) also include the device
calls (an H2D copy, a replay, a D2H copy, event records); ``aserve.bench.device_bench``
reports those.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
import torch

from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.device.decode_graphs import DecodeGraphs
from aserve.device.events import DeviceEvent
from aserve.device.future_map import FutureMap
from aserve.device.inputs import build_inputs
from aserve.device.runner import ModelRunner
from aserve.device.step import Step, StepOutputs
from aserve.engine.cell import OutputCell
from aserve.engine.commit import Committer
from aserve.kv.pool import KVPool
from aserve.models.config import ModelConfig
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import MaskFiller, fill_masks
from aserve.sampling_params import SamplingParams, StructuredOutputs
from aserve.scheduler.plan import Plan, SchedulerConfig
from aserve.scheduler.policy import Scheduler
from aserve.scheduler.req import Req

_CFG = ModelConfig(
    architecture="llama", vocab_size=64, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
    num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=4096, rope_theta=1e4,
)  # fmt: skip


class _Tokenizer:
    """The committer reads the tokenizer only for stop strings, which this run has none of."""


def _host_parts(
    batch: int, max_context: int, radix_cache: bool
) -> tuple[KVPool, Scheduler, DecodeGraphs, ModelRunner, Committer]:
    """The real planner, decode-graph ladder, runner and committer on the CPU, no model."""
    device = torch.device("cpu")
    pool = KVPool(_CFG, num_pages=batch * (max_context // 16 + 2), page_size=16, num_rows=batch,
                  max_context=max_context, dtype=torch.float32, device=device)  # fmt: skip
    sched = Scheduler(pool, SchedulerConfig(max_running_requests=batch, radix_cache=radix_cache,
                                            max_num_batched_tokens=8192))  # fmt: skip
    fmap = FutureMap(pool.rows.num_rows + 1, device, debug=False)
    graphs = DecodeGraphs(torch.nn.Identity(), pool, fmap, device, batch)
    runner = ModelRunner(torch.nn.Identity(), pool, device, fmap, None, None, decode_graphs=graphs)
    committer = Committer(sched, _Tokenizer(), on_finish=lambda r: None)  # type: ignore[arg-type]
    return pool, sched, graphs, runner, committer


def bench_batch(batch: int, steps: int, prompt_len: int = 128, grammars: Grammars | None = None) -> dict[str, Any]:
    """Steady greedy decode steps of ``batch`` requests; with ``grammars``, every request is
    constrained by :data:`STRUCTURED_BENCH_SCHEMA` (the device bench's) and each step also
    fills the rows' masks (timed apart: on the GPU that runs on the fill's pool while the
    loop waits) and commits, for every row, a token its mask allows (seeded, per row)."""
    _, sched, graphs, runner, committer = _host_parts(batch, prompt_len + steps + 128, radix_cache=False)
    spec = None if grammars is None else StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    params = SamplingParams(max_tokens=steps + 64, temperature=0, structured_outputs=spec)
    reqs = []
    for i in range(batch):
        r = Req(rid=f"r{i}", index=0, prompt_ids=list(range(2, prompt_len + 2)), params=params,
                max_new_tokens=steps + 64, seed=0, stop_ids=frozenset({1}))  # fmt: skip
        r.cell = OutputCell(wake_every=0)  # complete(): woken at the end only
        if grammars is not None and spec is not None:
            r.grammar = grammars.state(spec)
        sched.add(r)
        reqs.append(r)
    done = DeviceEvent("done")
    done._complete()  # the device work is left out: every step's events have passed
    picks = [random.Random(i) for i in range(batch)]
    fill_us: list[float] = []
    distinct: list[int] = []
    nonzero_words: list[float] = []

    automata = grammars is not None and grammars.fsms is not None
    allowed: dict[int, list[int]] = {}  # an automaton's mask row -> the tokens it allows

    def tokens_for(plan: Plan, host: Any) -> StepOutputs:
        """Token 7 for every row, or with grammars a token each constrained row's mask allows
        (with automata, from its state's row of the automaton's masks: no fill, as on a GPU,
        where the device gathers them)."""
        reqs = plan.reqs()
        out = [7] * len(reqs)
        if grammars is None:
            return StepOutputs(token_ids=out)
        rows = host.grammar_rows
        if automata:
            for i, st in rows:
                fsm = st.fsm
                row = fsm.row_of(st)
                if row not in allowed:
                    bits = fsm.masks[row].tolist()
                    allowed[row] = [32 * w + b for w, x in enumerate(bits) if x for b in range(32) if x >> b & 1]
                out[i] = picks[int(reqs[i].rid[1:])].choice(allowed[row])
            return StepOutputs(token_ids=out)
        t0 = time.perf_counter()
        masks = fill_masks([g for _, g in rows])
        fill_us.append((time.perf_counter() - t0) * 1e6)
        # What the step's masks hold (outside the timing): how many distinct ones, and how
        # many of a row's words are not zero (what an upload of distinct or sparse rows would
        # move instead of every row's every word).
        distinct.append(int(torch.unique(masks, dim=0).shape[0]))
        nonzero_words.append(float((masks != 0).sum(dim=1).float().mean()))
        for k, (i, _) in enumerate(rows):
            words = (masks[k] != 0).nonzero().flatten().tolist()
            pick = picks[int(reqs[i].rid[1:])]
            w = pick.choice(words)
            bits = int(masks[k, w]) & 0xFFFFFFFF
            out[i] = 32 * w + pick.choice([b for b in range(32) if bits >> b & 1])
        return StepOutputs(token_ids=out)

    def launch(plan: Plan, index: int) -> Any:
        host = build_inputs(plan, graphs)
        if automata:
            runner.automata.rows(plan, host)  # which rows' states the device holds (a GPU's launch)
        step = Step.of(index, plan, done, done, done, [host])
        step.grammar_rows = host.grammar_rows
        for r in plan.reqs():
            r.inflight += 1
        return step, host

    index = 0
    while not all(r.output_ids for r in reqs):  # the prefills, a token budget a step
        first = sched.schedule(False)
        assert isinstance(first, Plan)
        step, host = launch(first, index)
        step.outputs = tokens_for(first, host)
        committer.commit(step)
        index += 1
    plan_us, launch_us, commit_us, advance_us = [], [], [], []
    fill_us.clear()  # the prefill steps' fills are not the steady state's
    distinct.clear()
    nonzero_words.clear()
    before = committer.output_tokens
    for i in range(index, index + steps):
        t0 = time.perf_counter()
        plan = sched.schedule(False)
        t1 = time.perf_counter()
        assert isinstance(plan, Plan) and plan.num_decodes == batch
        step, host = launch(plan, i)
        assert grammars is None or len(host.grammar_rows) == batch, "every row is constrained"
        t2 = time.perf_counter()
        step.outputs = tokens_for(plan, host)  # with grammars: the fill, timed apart
        tc = time.perf_counter()
        advanced = committer.advance(step)  # the commit in its two parts: the grammar advance ...
        ta = time.perf_counter()
        committer.finish_commit(step, advanced)  # ... and the rest
        t3 = time.perf_counter()
        assert committer.output_tokens == before + batch, "every request commits one token a step"
        before = committer.output_tokens
        plan_us.append((t1 - t0) * 1e6)
        launch_us.append((t2 - t1) * 1e6)
        commit_us.append((t3 - tc) * 1e6)
        advance_us.append((ta - tc) * 1e6)
        for r in reqs:  # complete() takes its tokens at the end; this run never ends
            assert r.cell is not None
            r.cell.take_nowait()

    med = statistics.median
    p, lu, c = med(plan_us), med(launch_us), med(commit_us)
    out: dict[str, Any] = {
        "batch": batch, "steps": steps, "plan_us": p, "launch_host_us": lu, "commit_us": c,
        "total_us": p + lu + c, "per_request_us": (p + lu + c) / batch,
        "plan_us_per_req": p / batch, "launch_host_us_per_req": lu / batch, "commit_us_per_req": c / batch,
    }  # fmt: skip
    if grammars is not None:
        out.update(fill_us=med(fill_us) if fill_us else None, advance_us=med(advance_us), fill=grammars.filler.spec,
                   mask_cache_hits=grammars.masks.hits, mask_cache_misses=grammars.masks.misses,
                   distinct_masks=med(distinct) if distinct else None,
                   nonzero_words_per_row=statistics.mean(nonzero_words) if nonzero_words else None,
                   steady_steps=runner.automata.steady_steps)  # fmt: skip
    return out


def bench_mixed(batch: int, steps: int, seed: int = 4, warmup: int = 100) -> dict[str, Any]:
    """W1's steps on the host: ``batch`` running requests with prompts and outputs of 128-1024
    tokens from a queue of thousands, so most steps decode and some (a request ended, the next
    admitted) also carry a prompt chunk. The prefill graphs' inputs are built too (their ladder
    up to an 8192-token budget); the device work is left out as in :func:`bench_batch`."""
    from aserve.device.extend_graphs import ExtendGraphs

    rnd = random.Random(seed)
    pool, sched, graphs, _, committer = _host_parts(batch, 2100, radix_cache=True)
    xgraphs = ExtendGraphs(torch.nn.Identity(), pool, torch.device("cpu"), 8192, batch, _CFG.vocab_size)
    reqs = []
    for i in range(6 * batch):
        prompt_len, out_len = rnd.randint(128, 1024), rnd.randint(128, 1024)
        r = Req(rid=f"r{i}", index=0, prompt_ids=[rnd.randrange(2, _CFG.vocab_size) for _ in range(prompt_len)],
                params=SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True), max_new_tokens=out_len,
                seed=0, stop_ids=frozenset())  # fmt: skip
        r.cell = OutputCell(wake_every=0)
        sched.add(r)
        reqs.append(r)
    done = DeviceEvent("done")
    done._complete()
    rows: list[tuple[bool, float, float, float]] = []
    for i in range(steps):
        t0 = time.perf_counter()
        plan = sched.schedule(False)
        t1 = time.perf_counter()
        if not isinstance(plan, Plan):
            break
        step = Step.of(i, plan, done, done, done, [build_inputs(plan, graphs, xgraphs)])
        step.outputs = StepOutputs(token_ids=[7] * len(plan.reqs()))
        for r in plan.reqs():
            r.inflight += 1
        t2 = time.perf_counter()
        committer.commit(step)
        t3 = time.perf_counter()
        if i >= warmup:  # past the first wave's prefills
            rows.append((plan.num_decodes < len(plan.reqs()), t1 - t0, t2 - t1, t3 - t2))
        for r in reqs:
            if r.cell is not None:
                r.cell.take_nowait()
    out: dict[str, Any] = {"batch": batch, "steps": len(rows)}
    for kind, mixed in (("decode", False), ("mixed", True)):
        sel = [r for r in rows if r[0] == mixed]
        if sel:
            out[kind] = {"steps": len(sel), **{f"{name}_us": statistics.median(r[k] for r in sel) * 1e6
                                               for k, name in ((1, "plan"), (2, "launch_host"), (3, "commit"))}}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="host_step.json")
    ap.add_argument("--batches", default="64,256,512")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--mixed", action="store_true", help="W1-like steps (decodes plus a prompt chunk) at batch 256")
    ap.add_argument(
        "--constrained",
        action="store_true",
        help="every request constrained by the device bench's JSON schema (the default model's tokenizer)",
    )
    ap.add_argument(
        "--fill", default=None, help="with --constrained: the mask fill (serial, executor:N; default: the engine's)"
    )
    ap.add_argument(
        "--automata",
        action="store_true",
        help="with --constrained: the schema's token automaton, built before the steps (a GPU engine's default)",
    )
    ap.add_argument(
        "--tokenizer-dir", default=None, help="with --constrained: a tokenizer directory instead of the default GGUF's"
    )
    args = ap.parse_args()
    if args.mixed:

        async def run_mixed() -> dict[str, Any]:
            return bench_mixed(256, args.steps + 100)

        res = anyio.run(run_mixed)
        Path(args.out).write_text(json.dumps(res, indent=1))
        print(f"{'step':>8}{'n':>6}{'plan us':>10}{'launch us':>11}{'commit us':>11}")
        for kind in ("decode", "mixed"):
            if kind in res:
                r = res[kind]
                print(
                    f"{kind:>8}{r['steps']:>6}{r['plan_us']:>10.0f}{r['launch_host_us']:>11.0f}{r['commit_us']:>11.0f}"
                )
        return

    grammars = None
    if args.constrained:
        from aserve.bench.mask_fill import _tokenizer

        tok = _tokenizer(args.tokenizer_dir)
        filler = MaskFiller(args.fill) if args.fill else MaskFiller.for_device("cuda")
        grammars = Grammars(tok, tok.vocab_size, filler=filler, fsm=args.automata)
        if grammars.fsms is not None:
            spec = StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
            grammars.build_automaton(spec)
            assert grammars.fsms.wait(spec) is not None, "the bench schema's automaton was not built"

    async def run() -> list[dict[str, Any]]:  # steps carry awaitables: build them on a loop
        return [bench_batch(int(b), args.steps, grammars=grammars) for b in args.batches.split(",")]

    rows = anyio.run(run)
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(), "torch": torch.__version__,
        "machine": platform.machine(), "processor": platform.processor(), "batches": rows,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(results, indent=1))
    fill = f"{'fill us':>9}{'(advance us)':>14}{'distinct masks':>16}{'words set/row':>15}" if grammars else ""
    print(f"{'batch':>6}{'plan us':>10}{'launch us':>11}{'commit us':>11}{'total us':>10}{'us/req':>8}{fill}")
    for r in rows:
        fill = ""
        if grammars is not None and r["fill_us"] is None:  # automata: no fill on the host
            fill = f"{'-':>9}{r['advance_us']:>14.0f}{'-':>16}{'-':>15}"
        elif grammars is not None:
            fill = (f"{r['fill_us']:>9.0f}{r['advance_us']:>14.0f}{r['distinct_masks']:>16.0f}"
                    f"{r['nonzero_words_per_row']:>15.1f}")  # fmt: skip
        print(f"{r['batch']:>6}{r['plan_us']:>10.0f}{r['launch_host_us']:>11.0f}{r['commit_us']:>11.0f}"
              f"{r['total_us']:>10.0f}{r['per_request_us']:>8.2f}{fill}")  # fmt: skip


if __name__ == "__main__":
    main()

"""The decode step's device time, kernel by kernel, and the split-K decode attention's launch
parameters swept at the decode floor's shapes (issue 15: batch 256, context 1024).

    python -m aserve.bench.decode_kernels --out decode_kernels.json              # sweep + step profile
    python -m aserve.bench.decode_kernels --only sweep --shapes gemma3-270m      # one part

* ``sweep``: random bf16 queries and a paged cache filled as a fresh pool fills it (each
  sequence's slots in one run) and, as a check, its pages shuffled; every launch configuration is
  captured in a CUDA graph of 20 calls and replayed (no launch cost), its output compared with
  the default configuration's (``gpu_workloads.graph_time_us``). Bandwidth = the KV bytes the kernel must read / its time.
* ``step``: an engine at the floor's shapes (random weights), all requests decoding; the torch
  profiler records a window of whole decode steps (CUDA graph replays) and the table gives each
  kernel's device time per step, so the step's distance from its floor is charged to kernels.

Prints a table last and writes JSON. GPU only.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import time
from pathlib import Path
from typing import Any

import anyio
import torch

import aserve
from aserve.attention.triton_paged import DECODE_LAUNCH, DecodeLaunch, _decode
from aserve.bench.checkpoints import SHAPES, build_checkpoint
from aserve.bench.gpu_workloads import graph_time_us

BATCH, CONTEXT = 256, 1024
PAGE = 16  # EngineConfig's default page_size


def _layers(shape: str) -> list[tuple[str, int | None]]:
    """The attention kinds of a shape: (label, sliding window)."""
    s = SHAPES[shape]
    window = s.get("sliding_window")
    return [("global", None)] if window is None else [("window", int(window)), ("global", None)]


def sweep(
    shape: str, configs: list[DecodeLaunch], shuffled: bool, batch: int = BATCH, layout: str = "token"
) -> list[dict[str, Any]]:
    """``shuffled``: the slots in pages of 16 (the engine's default page) in random order, as a
    pool that has served many requests hands them out; otherwise each sequence's slots in one
    run. ``layout``: the cache's memory order (``aserve.kv.pool.kv_tensor``)."""
    s = SHAPES[shape]
    hkv, d, h = s["num_key_value_heads"], s["head_dim"], s["num_attention_heads"]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    slots = batch * CONTEXT + 1
    dims = (hkv, slots, d) if layout == "head" else (slots, hkv, d)
    k_cache, v_cache = (torch.randn(dims, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(2))
    if layout == "head":
        k_cache, v_cache = k_cache.transpose(0, 1), v_cache.transpose(0, 1)
    order = torch.arange(1, slots, device=dev)
    if shuffled:
        pages = order.view(-1, PAGE)
        order = pages[torch.randperm(pages.shape[0], device=dev, generator=gen)].reshape(-1)
    table = torch.zeros(batch + 1, CONTEXT, dtype=torch.int64, device=dev)
    table[1:] = order.view(batch, CONTEXT)
    rows = torch.arange(1, batch + 1, device=dev)
    seq_lens = torch.full((batch,), CONTEXT, dtype=torch.int64, device=dev)
    q = torch.randn(batch, h, d, device=dev, dtype=torch.bfloat16, generator=gen)
    scale = d**-0.5
    out: list[dict[str, Any]] = []
    for label, window in _layers(shape):
        keys = CONTEXT if window is None else min(CONTEXT, window)
        kv_bytes = batch * keys * 2 * hkv * d * 2
        ref = _decode(q, k_cache, v_cache, table, rows, seq_lens, CONTEXT, scale, window, torch.empty_like(q))
        for cfg in configs:
            o = torch.empty_like(q)
            row: dict[str, Any] = {"shape": shape, "batch": batch, "layer": label, "shuffled": shuffled,
                                   "layout": layout, **cfg.__dict__}  # fmt: skip
            try:
                call = functools.partial(_decode, q, k_cache, v_cache, table, rows, seq_lens, CONTEXT, scale, window,
                                         o, cfg)  # fmt: skip
                t = graph_time_us(call, "cuda") / 1e6
            except Exception as e:  # out of shared memory or registers: this configuration does not run
                row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
                out.append(row)
                continue
            row.update(us=t * 1e6, tb_s=kv_bytes / t / 1e12, max_diff=float((o.float() - ref.float()).abs().max()))
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def step_profile(shape: str, root: Path, tok_dir: Path, opts: dict[str, Any], steps: int = 24) -> dict[str, Any]:
    """Device time per kernel per decode step, over ``steps`` whole decode steps of ``BATCH``."""
    import random

    from torch.profiler import ProfilerActivity, profile

    path = root / shape
    if not (path / "config.json").exists():
        build_checkpoint(shape, root, tok_dir)
    prompts = [[2] + [random.Random(i).randrange(10, 1000) for _ in range(CONTEXT - 33)] for i in range(BATCH)]
    result: dict[str, Any] = {}

    async def run() -> None:
        async with aserve.Engine(
            model=str(path), device="cuda", dtype="bfloat16", max_context=CONTEXT + 8,
            max_running_requests=BATCH, max_num_batched_tokens=16384, **opts,
        ) as engine:  # fmt: skip
            counts = [0] * BATCH
            started, done = anyio.Event(), anyio.Event()
            prof = profile(activities=[ProfilerActivity.CUDA])
            first = {"steps": 0}

            def check() -> None:
                low = min(counts)
                if low >= 4 and not started.is_set():
                    first["steps"] = engine.stats().num_steps
                    prof.start()
                    started.set()
                if low >= 4 + steps and started.is_set() and not done.is_set():
                    torch.cuda.synchronize()
                    prof.stop()
                    result["steps"] = engine.stats().num_steps - first["steps"]
                    done.set()

            async def one(i: int) -> None:
                params = aserve.SamplingParams(max_tokens=steps + 16, temperature=0, ignore_eos=True)
                async for delta in engine.generate(prompts[i], params):
                    counts[i] += len(delta.token_ids)
                    check()

            async with anyio.create_task_group() as tg:
                for i in range(BATCH):
                    tg.start_soon(one, i)
            graphs = engine.runner.decode_graphs
            assert graphs is not None, "the step profile needs the decode graphs"
            result["step_replay_ms"] = graphs.replay_seconds(BATCH) * 1e3
            recs = [r for r in engine.step_records() if r.num_decodes == r.num_seqs == BATCH]
            result["step_busy_ms_median"] = sorted(r.device_busy_s for r in recs)[len(recs) // 2] * 1e3
            per_kernel = []
            for evt in prof.key_averages():
                dev_us = getattr(evt, "self_device_time_total", 0) or 0
                if dev_us > 0:
                    per_kernel.append({"name": evt.key[:90], "calls": evt.count, "us_total": dev_us})
            n = max(1, result["steps"])
            for k in per_kernel:
                k["us_per_step"] = k["us_total"] / n
                k["calls_per_step"] = k["calls"] / n
            per_kernel.sort(key=lambda k: -k["us_total"])
            result["kernels"] = per_kernel
            result["kernel_us_per_step"] = sum(k["us_per_step"] for k in per_kernel)

    anyio.run(run)
    return {"shape": shape, **result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="decode_kernels.json")
    ap.add_argument("--only", default="sweep,step", help="comma list of: sweep, step")
    ap.add_argument("--shapes", default="gemma3-270m,llama3.2-1b")
    ap.add_argument("--tokenizer-dir", default=".gpu")
    ap.add_argument("--work-dir", default="/tmp/aserve-bench")
    ap.add_argument("--block-n", default="32,64,128")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--splits", default="0,1,4,8", help="0: the kernel's own choice")
    ap.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--batches", default=str(BATCH), help="the sweep's batch sizes")
    ap.add_argument("--kv-layouts", default="token", help="the sweep's cache layouts: token, head")
    args = ap.parse_args()
    from aserve.bench.gpu_workloads import parse_engine_opts

    only = set(args.only.split(","))
    shapes = args.shapes.split(",")
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    configs = [
        DecodeLaunch(block_n=b, num_warps=w, num_stages=st, splits=sp)
        for b, w, st, sp in itertools.product(
            ints(args.block_n), ints(args.warps), ints(args.stages), ints(args.splits)
        )
    ]
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": torch.cuda.get_device_name(),
                               "torch": torch.__version__, "aserve": aserve.__version__}  # fmt: skip
    out = Path(args.out)
    if "sweep" in only:
        results["sweep"] = []
        for shape, batch, layout in itertools.product(shapes, ints(args.batches), args.kv_layouts.split(",")):
            results["sweep"] += sweep(shape, configs, shuffled=False, batch=batch, layout=layout)
            results["sweep"] += sweep(shape, [DECODE_LAUNCH], shuffled=True, batch=batch, layout=layout)
            out.write_text(json.dumps(results, indent=1))
    if "step" in only:
        opts = {"attention_backend": "triton", **parse_engine_opts(args.engine_opt)}
        results["step"] = [step_profile(s, Path(args.work_dir), Path(args.tokenizer_dir), opts) for s in shapes]
        out.write_text(json.dumps(results, indent=1))
    _table(results)


def _table(results: dict[str, Any]) -> None:
    rows = [r for r in results.get("sweep", []) if "us" in r]

    def key_of(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["shape"], r["batch"], r["layout"], r["layer"], r["shuffled"]

    for key in sorted({key_of(r) for r in rows}):
        mine = sorted((r for r in rows if key_of(r) == key), key=lambda r: r["us"])
        default = next(
            (r for r in mine if (r["block_n"], r["num_warps"], r["num_stages"], r["splits"]) == (32, 4, 0, 0)), None
        )
        print(f"\n{key[0]} b={key[1]} {key[2]}-major {key[3]} layer{' (pages shuffled)' if key[4] else ''}:"
              f" default {default['us']:.1f} us ({default['tb_s']:.2f} TB/s)" if default else "")  # fmt: skip
        for r in mine[:5]:
            print(f"  block_n {r['block_n']:>3} warps {r['num_warps']} stages {r['num_stages']} splits {r['splits']}:"
                  f" {r['us']:.1f} us, {r['tb_s']:.2f} TB/s, max diff {r['max_diff']:.2e}")  # fmt: skip
    for st in results.get("step", []):
        print(f"\n{st['shape']}: decode graph replay {st['step_replay_ms']:.3f} ms; median step span "
              f"{st['step_busy_ms_median']:.3f} ms (engine's counters, the profiler on); "
              f"kernels {st['kernel_us_per_step']:.0f} us per step over {st['steps']} steps")  # fmt: skip
        for k in st["kernels"][:20]:
            print(f"  {k['us_per_step']:8.1f} us  {k['calls_per_step']:6.1f} calls  {k['name']}")


if __name__ == "__main__":
    main()

"""Engine checks and timings on random weights in real model shapes (meant for the GPU machine).

    python -m aserve.bench.device_bench --out results.json [--tiny] [--device cuda] [--only parity,bf16,w2]
    python -m aserve.bench.device_bench --only copy,w1,floor,w3 --attention-backend triton   # issue 6

* copy/w1/floor/w3: see ``loadgen/gpu_workloads.py`` (W1 offline vs transformers
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
import gc
import json
import os
import platform
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import torch

import aserve
from aserve.bench import gpu_workloads as gw

SHAPES: dict[str, dict[str, Any]] = {
    "gemma3-270m": {
        "arch": "gemma3", "vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048,
        "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
        "sliding_window": 512, "max_position_embeddings": 32768, "query_pre_attn_scalar": 256,
    },
    "llama3.2-1b": {
        "arch": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "max_position_embeddings": 131072, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    },
    # Small stand-ins so the script itself can be exercised on a CPU.
    "tiny-gemma3": {
        "arch": "gemma3", "vocab_size": 262144, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "sliding_window": 16, "max_position_embeddings": 4096, "query_pre_attn_scalar": 32,
    },
    "tiny-llama": {
        "arch": "llama", "vocab_size": 128256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 4096, "tie_word_embeddings": True,
    },
}  # fmt: skip


def build_checkpoint(shape: str, root: Path, tokenizer_dir: Path, seed: int = 0) -> tuple[Path, Any]:
    """Random weights (transformers' init) saved as safetensors, plus the tokenizer files."""
    spec = dict(SHAPES[shape])
    arch = spec.pop("arch")
    torch.manual_seed(seed)
    model: Any
    if arch == "gemma3":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        n = spec["num_hidden_layers"]
        layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
        if "full_attention" not in layer_types:
            layer_types[-1] = "full_attention"
        gcfg = Gemma3TextConfig(**spec, layer_types=layer_types, bos_token_id=2, eos_token_id=1, pad_token_id=0)
        model = Gemma3ForCausalLM(gcfg)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        lcfg = LlamaConfig(**spec, bos_token_id=2, eos_token_id=1, pad_token_id=0)
        model = LlamaForCausalLM(lcfg)
    model.eval()
    path = root / shape
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    shutil.copy(tokenizer_dir / "tokenizer.model", path / "tokenizer.model")
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<bos>", "eos_token": "<eos>", "add_bos_token": True})
    )
    return path, model


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[2] + [rng.randrange(10, min(vocab, 200_000)) for _ in range(length - 1)] for _ in range(n)]


async def _run_batch(engine: aserve.Engine, prompts: list[list[int]], params: aserve.SamplingParams) -> list[Any]:
    out: list[Any] = [None] * len(prompts)

    async def one(i: int) -> None:
        out[i] = await engine.complete(prompts[i], params)

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return out


def check_parity(
    shape: str, root: Path, tok_dir: Path, device: str, max_new: int, opts: dict[str, Any]
) -> dict[str, Any]:
    path, hf = build_checkpoint(shape, root, tok_dir)
    hf = hf.to(device=device, dtype=torch.float32)
    hf.config._attn_implementation = "sdpa"
    prompts = _prompts(4, 12, hf.config.vocab_size, seed=1) + _prompts(2, 70, hf.config.vocab_size, seed=2)
    refs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            out = hf.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=None, pad_token_id=0)
            refs.append(out[0, len(p) :].tolist())
    del hf
    if device == "cuda":
        torch.cuda.empty_cache()
    params = aserve.SamplingParams(max_tokens=max_new, temperature=0, ignore_eos=True)

    async def run() -> list[Any]:
        async with aserve.Engine(model=str(path), device=device, dtype="float32", warmup=False,
                                 kv_cache_bytes=2**30, max_context=512, **opts) as engine:  # fmt: skip
            return await _run_batch(engine, prompts, params)

    res = anyio.run(run)
    matched = sum(r.token_ids == ref for r, ref in zip(res, refs))
    first_div = []
    for r, ref in zip(res, refs):
        k = next((i for i, (a, b) in enumerate(zip(r.token_ids, ref)) if a != b), None)
        first_div.append(k)
    return {"shape": shape, "requests": len(prompts), "exact_match": matched, "first_divergence": first_div}


def run_throughput(
    shape: str, root: Path, tok_dir: Path, device: str, dtype: str, n: int, prompt_len: int, out_len: int,
    overlap: bool, max_running: int, opts: dict[str, Any], profiler: Any = None,
) -> dict[str, Any]:  # fmt: skip
    path = root / shape
    if not (path / "config.json").exists():
        build_checkpoint(shape, root, tok_dir)
    vocab = SHAPES[shape]["vocab_size"]
    prompts = _prompts(n, prompt_len, vocab, seed=3)
    params = aserve.SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True)
    kv_bytes = (8 if device.startswith("cuda") else 1) * 2**30  # a CPU run (--tiny) has host memory only

    async def run() -> dict[str, Any]:
        async with aserve.Engine(model=str(path), device=device, dtype=dtype, overlap=overlap,
                                 max_running_requests=max_running, max_context=prompt_len + out_len + 8,
                                 max_num_batched_tokens=8192, kv_cache_bytes=kv_bytes, **opts) as engine:  # fmt: skip
            engine.reset_stats()
            if profiler is not None:  # serving only: not start-up, compilation or capture
                profiler.enable()
            gc_log = _GcPauses()
            t0 = time.perf_counter()
            with gc_log:
                res = await _run_batch(engine, prompts, params)
            wall = time.perf_counter() - t0
            if profiler is not None:
                profiler.disable()
            st = engine.stats()
            recs = engine.step_records()
        out_tokens = sum(len(r.token_ids) for r in res)
        decode = [r for r in recs if r.num_decodes == r.num_seqs]
        gaps = [r.device_gap_s for r in decode if r.device_gap_s is not None]
        busy = sum(r.device_busy_s for r in recs)
        span = sum(r.device_busy_s + (r.device_gap_s or 0.0) for r in recs)
        steady = [r for r in decode if r.num_seqs == n]
        steady_busy = sum(r.device_busy_s for r in steady)
        steady_gap = sum(r.device_gap_s or 0.0 for r in steady)

        def med(xs: list[float]) -> float | None:
            return statistics.median(xs) if xs else None

        # Where host time and idle sit in the run: a one-time cost (compiles, allocator growth,
        # first graph replays) shows in the first quarter only; a steady one in every quarter.
        quarters = [steady[k * len(steady) // 4 : (k + 1) * len(steady) // 4] for k in range(4)]
        by_quarter = [
            {
                "steps": len(q),
                "launch_ms_median": med([r.launch_s * 1e3 for r in q]),
                "plan_ms_median": med([r.plan_s * 1e3 for r in q]),
                "idle_fraction": sum(r.device_gap_s or 0.0 for r in q)
                / max(sum(r.device_busy_s + (r.device_gap_s or 0.0) for r in q), 1e-12),
            }
            for q in quarters
        ]
        slowest = sorted(recs, key=lambda r: r.launch_s, reverse=True)[:5]

        return {
            "shape": shape, "dtype": dtype, "overlap": overlap, "opts": opts, "requests": n, "prompt_len": prompt_len,
            "output_len": out_len, "wall_s": wall, "output_tokens": out_tokens, "output_tok_s": out_tokens / wall,
            "steps": st.num_steps, "median_decode_gap_us": statistics.median(gaps) * 1e6 if gaps else None,
            "p90_decode_gap_us": sorted(gaps)[int(0.9 * (len(gaps) - 1))] * 1e6 if gaps else None,
            "device_busy_fraction": busy / span if span else None,
            "steady_decode_idle_fraction": steady_gap / (steady_busy + steady_gap) if steady else None,
            "median_step_busy_ms": med([r.device_busy_s * 1e3 for r in decode]),
            "host_plan_ms_per_step": st.host_plan_s / st.num_steps * 1e3,
            "host_launch_ms_per_step": st.host_launch_s / st.num_steps * 1e3,
            "host_commit_ms_per_step": st.host_commit_s / st.num_steps * 1e3,
            "steady_by_quarter": by_quarter,
            "gc_pauses": gc_log.summary(),
            "slowest_launches": [{"step": r.index, "seqs": r.num_seqs, "tokens": r.num_tokens,
                                  "launch_ms": r.launch_s * 1e3} for r in slowest],
        }  # fmt: skip

    return anyio.run(run)


class _GcPauses:
    """Cyclic-GC collections while serving (gc.callbacks): count, total and longest pause
    per generation. A full collection stalls the loop that launches steps."""

    def __init__(self) -> None:
        self._start = 0.0
        self.pauses: list[tuple[int, float]] = []

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._start))

    def __enter__(self) -> _GcPauses:
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._cb)

    def summary(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for gen in sorted({g for g, _ in self.pauses}):
            ds = [d for g, d in self.pauses if g == gen]
            out[f"gen{gen}"] = {"count": len(ds), "total_ms": sum(ds) * 1e3, "max_ms": max(ds) * 1e3}
        return out


def bench_wakeup(waits: int = 40, sleep_cycles: int = 2_700_000) -> list[dict[str, Any]]:
    """Wake-up latency and CPU cost of three ways to await a CUDA event from the event loop.

    A spinning helper thread timestamps the moment each event completes (``query()`` in a
    tight loop); the awaiting coroutine timestamps when it resumes. CPU cost is process CPU
    time (all threads, the spinner excluded by running it only in a calibration pass).
    The GPU sleep is not a whole number of milliseconds (about 1.35 ms on the H200), so a
    timer that only fired on millisecond ticks could not line up with it by accident.
    "engine-poll" is what the engine does (``DeviceEvent`` polling).
    """
    import threading

    from aserve.device.events import CudaEventWaiter, DeviceEvent, LoopWaker

    def gpu_event() -> torch.cuda.Event:
        torch.cuda._sleep(sleep_cycles)
        ev = torch.cuda.Event()
        ev.record()
        return ev

    def done_time(ev: torch.cuda.Event) -> float:
        while not ev.query():
            pass
        return time.perf_counter()

    async def _poll(name: str, ev: torch.cuda.Event) -> None:
        if name == "engine-poll":
            await DeviceEvent("bench", ev, poll_s=50e-6).wait()
        elif name == "poll-yield":
            while not ev.query():
                await anyio.lowlevel.checkpoint()
        else:
            while not ev.query():
                await anyio.sleep(50e-6)

    async def strategy(name: str) -> dict[str, Any]:
        waiter = CudaEventWaiter(LoopWaker()) if name == "waiter-thread" else None
        lat: list[float] = []
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _i in range(waits):
            ev = gpu_event()
            if name == "waiter-thread":
                assert waiter is not None
                dev = DeviceEvent("bench", ev)
                waiter.watch(dev)
                await dev.wait()
            else:
                await _poll(name, ev)
            lat.append(time.perf_counter())
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        if waiter is not None:
            waiter.close()
        # Calibration pass: the same events with a spinning timestamp thread -> latency.
        lats = []
        for _i in range(10):
            ev = gpu_event()
            box: dict[str, float] = {}
            th = threading.Thread(target=lambda e=ev, b=box: b.__setitem__("t", done_time(e)))
            th.start()
            if name == "waiter-thread":
                waiter2 = CudaEventWaiter(LoopWaker())
                dev = DeviceEvent("bench", ev)
                waiter2.watch(dev)
                await dev.wait()
                waiter2.close()
            else:
                await _poll(name, ev)
            t_wake = time.perf_counter()
            th.join()
            lats.append(t_wake - box["t"])
        return {"strategy": name, "cpu_s_per_wall_s": cpu / wall, "median_wake_latency_us": statistics.median(lats) * 1e6,
                "max_wake_latency_us": max(lats) * 1e6}  # fmt: skip

    out = []
    for name in ("waiter-thread", "poll-yield", "poll-sleep-50us", "engine-poll"):
        out.append(anyio.run(strategy, name))
    return out


def profile_host(shape: str, root: Path, tok_dir: Path, device: str, dtype: str, opts: dict[str, Any]) -> str:
    """cProfile of the event-loop thread during a decode-heavy run: where host time goes."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    run_throughput(shape, root, tok_dir, device, dtype, 64, 128, 256, True, 256, opts, profiler=prof)
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(45)
    return buf.getvalue()


class _TorchProfiler:
    """torch.profiler behind the enable/disable pair that ``run_throughput`` calls."""

    def __init__(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = profile(activities=acts)

    def enable(self) -> None:
        self.prof.start()

    def disable(self) -> None:
        self.prof.stop()


def profile_device(shape: str, root: Path, tok_dir: Path, device: str, dtype: str, opts: dict[str, Any]) -> str:
    """torch.profiler over a short decode-heavy run: device time per kernel, host time per op."""
    p = _TorchProfiler()
    run_throughput(shape, root, tok_dir, device, dtype, 64, 128, 64, True, 256, opts, profiler=p)
    avg = p.prof.key_averages()
    dev_key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    return (
        avg.table(sort_by=dev_key, row_limit=30, max_name_column_width=60)
        + "\n"
        + avg.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)
    )


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
        help="comma list of: wake, parity, bf16, w2, copy, w1, floor, w3, ops, profile, kprofile",
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
    ap.add_argument("--w1-shapes", default="gemma,llama", help="which shapes W1 runs: gemma, llama or both")
    ap.add_argument("--w1-peer-requests", type=int, default=100, help="transformers runs this many of the W1 requests")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run in the interpreter there
    opts: dict[str, Any] = {"attention_backend": args.attention_backend, **gw.parse_engine_opts(args.engine_opt)}
    root, tok = Path(args.work_dir), Path(args.tokenizer_dir)
    g, ll = ("tiny-gemma3", "tiny-llama") if args.tiny else ("gemma3-270m", "llama3.2-1b")
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
        w1_shapes = [s for key, s in (("gemma", g), ("llama", ll)) if key in args.w1_shapes.split(",")]
        for shape in w1_shapes:
            path = root / shape
            if not (path / "config.json").exists():
                build_checkpoint(shape, root, tok)
            lo, hi = (8, 24) if args.tiny else (128, 1024)
            reqs = gw.w1_requests(args.w1_requests, lo, hi, SHAPES[shape]["vocab_size"], seed=4)
            ours = gw.w1_aserve(path, reqs, args.device, bf16, opts)
            peer_reqs = reqs[: args.w1_peer_requests]
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
        shape = ll
        path = root / shape
        if not (path / "config.json").exists():
            build_checkpoint(shape, root, tok)
        batch, ctx = (8, 64) if args.tiny else (256, 1024)
        spec = {k: v for k, v in SHAPES[shape].items() if k != "arch"}
        floor = gw.decode_floor(spec, batch, ctx, results["copy_bytes_per_s"], 4 if bf16 == "float32" else 2)
        step = gw.decode_step_time(path, batch, ctx, args.device, bf16, opts)
        results["floor"] = {"shape": shape, "batch": batch, "context": ctx, "floor_ms": floor * 1e3,
                            "step_ms": step * 1e3, "step_over_floor": step / floor}  # fmt: skip
        print(json.dumps(results["floor"]), flush=True)
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
        results["profile"] = profile_host(g, root, tok, args.device, bf16, opts)
        print(results["profile"], flush=True)
        save()
    if "kprofile" in only:
        results["kprofile"] = profile_device(g, root, tok, args.device, bf16, opts)
        print(results["kprofile"], flush=True)
        save()
    save()
    _table(results)


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
            f"{r['ratio']:.1f}x"
        )
    if "floor" in results:
        f = results["floor"]
        print(f"decode step {f['shape']} b={f['batch']} ctx={f['context']}: {f['step_ms']:.2f} ms, "
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
        f"{'run':>34} {'tok/s':>9} {'gap p50 us':>10} {'idle%':>6} {'busy ms':>8} {'plan':>6} {'launch':>6} {'commit':>6} {'gc2 n/ms':>9}"
    )
    for key in ("bf16", "w2"):
        for r in results.get(key, []):
            name = f"{key} {r['shape']} {'overlap' if r['overlap'] else 'serial'}"
            gap = r["median_decode_gap_us"]
            idle = r["steady_decode_idle_fraction"]
            full = r.get("gc_pauses", {}).get("gen2", {"count": 0, "total_ms": 0.0})
            print(
                f"{name:>34} {r['output_tok_s']:9.1f} {gap if gap is None else round(gap, 1)!s:>10} "
                f"{'-' if idle is None else round(100 * idle, 2)!s:>6} {r['median_step_busy_ms'] or 0:8.2f} "
                f"{r['host_plan_ms_per_step']:6.2f} {r['host_launch_ms_per_step']:6.2f} {r['host_commit_ms_per_step']:6.2f} "
                f"{full['count']:>3}/{full['total_ms']:<5.1f}"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

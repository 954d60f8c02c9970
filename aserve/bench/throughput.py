"""``device_bench``'s batched throughput run (sections ``bf16`` and ``w2``) and the two
profiles taken over it (``profile``: cProfile of the loop thread; ``kprofile``: torch.profiler).
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
import torch

import aserve
from aserve.bench.checkpoints import SHAPES, _prompts, _run_batch, build_checkpoint


def run_throughput(
    shape: str, root: Path, tok_dir: Path, device: str, dtype: str, n: int, prompt_len: int, out_len: int,
    overlap: bool, max_running: int, opts: dict[str, Any], profiler: Any = None,
    structured: aserve.StructuredOutputs | None = None,
) -> dict[str, Any]:  # fmt: skip
    path = root / shape
    if not (path / "config.json").exists():
        build_checkpoint(shape, root, tok_dir)
    vocab = SHAPES[shape]["vocab_size"]
    prompts = _prompts(n, prompt_len, vocab, seed=3)
    params = aserve.SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True, structured_outputs=structured)
    kv_bytes = (8 if device.startswith("cuda") else 1) * 2**30  # a CPU run (--tiny) has host memory only

    async def run() -> dict[str, Any]:
        async with aserve.Engine(model=str(path), device=device, dtype=dtype, overlap=overlap,
                                 max_running_requests=max_running, max_context=prompt_len + out_len + 8,
                                 max_num_batched_tokens=8192, kv_cache_bytes=kv_bytes, **opts) as engine:  # fmt: skip
            if structured is not None:
                # One-time costs of the first constrained request (llguidance's tokenizer over the
                # vocabulary, ~1 s; the schema's compile, cached by key) are not decode throughput.
                await engine.complete(prompts[0], aserve.SamplingParams(max_tokens=2, temperature=0,
                                                                         structured_outputs=structured))  # fmt: skip
                # So is the token automaton's build, with ASERVE_GRAMMAR_FSM=1.
                await engine.prepare_structured_outputs(structured)
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
            loop = engine._loop
            split = {"split_steps": engine.runner.split_steps, "planned_ahead": loop.planned_ahead,
                     "early_samplers": loop.early_samplers, "launched_behind": loop.launched_behind,
                     "fsm_device_steps": engine.runner.fsm_device_steps,
                     "fsm_steady_steps": engine.runner.fsm_steady_steps,
                     "fsm_one_launch_steps": engine.runner.automata.one_launch_steps}  # fmt: skip
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
            # Decode alone, every request running (prefill and the last steps' ramp-down left out):
            # a token a request a step over the device's span of those steps, idle included.
            "steady_decode_tok_s": n * len(steady) / (steady_busy + steady_gap) if steady else None,
            "median_step_busy_ms": med([r.device_busy_s * 1e3 for r in decode]),
            "host_plan_ms_per_step": st.host_plan_s / st.num_steps * 1e3,
            "host_launch_ms_per_step": st.host_launch_s / st.num_steps * 1e3,
            "host_commit_ms_per_step": st.host_commit_s / st.num_steps * 1e3,
            "steady_by_quarter": by_quarter,
            "gc_pauses": gc_log.summary(),
            "split": split,  # structured runs: steps launched in two, and what ran in their waits
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


def profile_host(
    shape: str, root: Path, tok_dir: Path, device: str, dtype: str, opts: dict[str, Any],
    structured: aserve.StructuredOutputs | None = None, batch: int = 64,
) -> str:  # fmt: skip
    """cProfile of the event-loop thread during a decode-heavy run of ``batch`` requests at
    once: where host time goes (every request constrained by ``structured`` when given)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    run_throughput(
        shape, root, tok_dir, device, dtype, batch, 128, 256, True, max(256, batch), opts, profiler=prof,
        structured=structured,
    )  # fmt: skip
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

"""Issue 6's workloads for ``aserve.bench.device_bench``: W1 offline vs transformers, W3 online
through the HTTP server, the decode-step floor, and the copy bandwidth it is measured against.

Every function takes sizes as arguments so a CPU smoke run (``--tiny``) exercises the same
code as the H200 run.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import torch

import aserve


def parse_engine_opts(items: list[str]) -> dict[str, Any]:
    """``["cuda_graph=true", "max_running_requests=128"]`` -> engine keyword arguments."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--engine-opt wants KEY=VALUE, got {item!r}")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for conv in (int, float):
                try:
                    value = conv(raw)
                    break
                except ValueError:
                    pass
        out[key.strip()] = value
    return out


def cli_flags(opts: dict[str, Any]) -> list[str]:
    """Engine keyword arguments -> ``aserve serve`` flags (``--cuda-graph``, ``--page-size 16``)."""
    flags: list[str] = []
    for key, value in opts.items():
        if key in ("overlap", "radix_cache"):  # on by default; only a --disable-... flag exists
            flags += [] if value else ["--disable-" + key.replace("_", "-")]
        elif isinstance(value, bool):
            flags.append(("--" if value else "--no-") + key.replace("_", "-"))
        else:
            flags += ["--" + key.replace("_", "-"), str(value)]
    return flags


def copy_bandwidth(device: str, nbytes: int = 2 * 2**30, reps: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second (the memory roofline used below)."""
    n = nbytes // 2
    src = torch.randn(n // 4, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    else:
        t0 = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src)
        seconds = time.perf_counter() - t0
    return 2 * src.numel() * 4 * reps / seconds


def w1_requests(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    """(prompt ids, output length), prompt and output lengths uniform in [lo, hi]."""
    rng = random.Random(seed)
    return [
        ([2] + [rng.randrange(10, min(vocab, 200_000)) for _ in range(rng.randint(lo, hi) - 1)], rng.randint(lo, hi))
        for _ in range(n)
    ]


def w1_aserve(
    path: Path, reqs: list[tuple[list[int], int]], device: str, dtype: str, opts: dict[str, Any]
) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        ctx = max(len(p) + o for p, o in reqs) + 8
        # The defaults a user gets (batch sizes from the device) unless opts set them.
        async with aserve.Engine(model=str(path), device=device, dtype=dtype, max_context=ctx, **opts) as engine:
            info = engine.info()
            engine.reset_stats()
            t0 = time.perf_counter()
            total = 0

            async def one(prompt: list[int], out_len: int) -> None:
                nonlocal total
                r = await engine.complete(
                    prompt, aserve.SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True)
                )
                total += len(r.token_ids)

            async with anyio.create_task_group() as tg:
                for p, o in reqs:
                    tg.start_soon(one, p, o)
            wall = time.perf_counter() - t0
            st = engine.stats()
        span = st.device_busy_s + st.device_gap_s
        return {"engine": "aserve", "opts": opts, "requests": len(reqs), "output_tokens": total, "wall_s": wall,
                "output_tok_s": total / wall, "max_running_requests": info["max_running_requests"],
                "max_num_batched_tokens": info["max_num_batched_tokens"], "batch_sizes": info["batch_sizes"],
                "device_idle_fraction": st.device_gap_s / span if span else None,
                "median_decode_gap_us": None if st.median_decode_gap_s is None else st.median_decode_gap_s * 1e6}  # fmt: skip

    return anyio.run(run)


def w1_transformers(model: Any, reqs: list[tuple[list[int], int]]) -> dict[str, Any]:
    """transformers continuous batching (``generate_batch``, paged|sdpa), the issue's peer.

    ``generate_batch`` takes one generation config for all requests, so the peer's requests
    all get the median of their output lengths (one call, so it batches them all; grouping
    by exact length would hand it batches of one). Tokens per second count what it generated.
    """
    from transformers import GenerationConfig

    model.set_attn_implementation("paged|sdpa")
    out_len = sorted(o for _, o in reqs)[len(reqs) // 2]
    gc = GenerationConfig(max_new_tokens=out_len, do_sample=False, eos_token_id=None, pad_token_id=0)
    t0 = time.perf_counter()
    outs = model.generate_batch(inputs=[p for p, _ in reqs], generation_config=gc, progress_bar=False)
    wall = time.perf_counter() - t0
    total = sum(len(o.generated_tokens) for o in outs.values())
    return {"engine": "transformers generate_batch", "requests": len(reqs), "output_len_each": out_len,
            "output_tokens": total, "wall_s": wall, "output_tok_s": total / wall}  # fmt: skip


def decode_floor(shape_spec: dict[str, Any], batch: int, context: int, bandwidth: float, dtype_bytes: int = 2) -> float:
    """Seconds one decode step must take at least: weight bytes + KV bytes read, over the
    measured copy bandwidth. That figure counts bytes read + written, i.e. the memory
    traffic the device sustains; a step that only reads moves its bytes at that same rate.
    (The first version divided by half of it: the H200 then ran a step "faster than its
    floor", 3.98 ms against 5.22 ms, which is how the error showed.)"""
    s = shape_spec
    h, inter, layers, vocab = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["vocab_size"]
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * inter
    weights = (layers * per_layer + vocab * h) * dtype_bytes
    # The KV the attention really reads: a sliding-window layer (Gemma 3: all but every sixth,
    # as checkpoints.build_checkpoint lays them out) reads at most its window.
    window = s.get("sliding_window")
    read = [context if window is None or (i + 1) % 6 == 0 else min(context, window) for i in range(layers)]
    kv_bytes = batch * sum(read) * 2 * kv * dtype_bytes
    return (weights + kv_bytes) / bandwidth


def decode_step_time(
    path: Path, batch: int, context: int, device: str, dtype: str, opts: dict[str, Any]
) -> tuple[float, float | None]:
    """A decode step with ``batch`` sequences near ``context`` tokens: (median device span of
    the run's decode steps, device seconds per replay of the batch's decode graph afterwards).

    Prompts of ``context - 32`` tokens and 48 output tokens: once the (chunked) prefills are
    done every step decodes the whole batch, at contexts around ``context``. The span runs from
    the step's first device event to its last, so a host slower than the device adds its own
    wait to it; the replays, back to back with no host work between them, are the device's
    time alone (None without CUDA graphs)."""
    prompts = [[2] + [random.Random(i).randrange(10, 1000) for _ in range(context - 33)] for i in range(batch)]

    async def run() -> tuple[float, float | None]:
        async with aserve.Engine(
            model=str(path), device=device, dtype=dtype, max_context=context + 8,
            max_running_requests=batch, max_num_batched_tokens=16384, **opts,
        ) as engine:  # fmt: skip
            engine.reset_stats()
            async with anyio.create_task_group() as tg:
                for p in prompts:
                    tg.start_soon(
                        engine.complete, p, aserve.SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
                    )
            recs = [r for r in engine.step_records() if r.num_decodes == r.num_seqs == batch]
            graphs = engine.runner.decode_graphs
            replay = graphs.replay_seconds(batch) if graphs is not None and device == "cuda" else None
        if not recs:
            raise RuntimeError(f"no decode step ran with all {batch} sequences")
        return statistics.median(r.device_busy_s for r in recs), replay

    return anyio.run(run)


def w3_online(path: Path, rates: list[float], num_requests: int, in_len: int, out_len: int,
              out_dir: Path, server_args: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """Start ``aserve serve`` on the checkpoint, run loadgen Poisson runs at each rate."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "aserve", "serve", "--model", str(path), "--port", str(port),
           "--served-model-name", "bench", *server_args]  # fmt: skip
    log = open(out_dir / "w3_server.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    rows = []
    try:
        for rate in rates:
            label = f"w3_rate{rate:g}"
            subprocess.run(
                [sys.executable, "-m", "loadgen", "run", "--base-url", f"http://127.0.0.1:{port}", "--model", "bench",
                 "--tokenizer", str(path), "--workload", "random", "--num-requests", str(num_requests),
                 "--input-len", str(in_len), "--output-len", str(out_len), "--rate", str(rate), "--seed", "1",
                 "--no-progress", "--no-plots", "--ready-timeout", "600", "--out", str(out_dir), "--label", label],
                check=True, env=env, timeout=900,
            )  # fmt: skip
            summary = json.loads((out_dir / f"{label}.json").read_text())
            lat = summary["latency_s"]
            rows.append({
                "rate": rate, "output_tok_s": summary["throughput"]["output_tok_per_s"],
                **{f"{m}_{q}_ms": lat[m][q] * 1e3 for m in ("ttft", "tpot", "itl") for q in ("p50", "p99")},
            })  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    return rows


def graph_time_us(fn: Any, device: str, reps: int = 20, replays: int = 10) -> float:
    """Device time of one ``fn()`` call: ``reps`` calls captured in one CUDA graph and
    replayed, so host launch cost is excluded (on a CPU: the wall time of direct calls). On CUDA
    the warm-up calls and the capture share one stream (what ``fn`` keeps per stream, such as
    the inline merge's counters, is made before the capture, as in the engine)."""
    if device != "cuda":
        for _ in range(3):
            fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps * 1e6
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for _ in range(reps):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * replays)


def _eager_time_us(fn: Any, device: str, reps: int = 200) -> float:
    """Wall time per call launched from Python, back to back (what an uncaptured step pays)."""
    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def small_op_compare(device: str, dtype: str, tokens: list[int], compile_ops: bool = True) -> list[dict[str, Any]]:
    """The fused Triton kernels against the eager torch ops they replace and against
    ``torch.compile`` of those same eager ops, Gemma 3 270M sizes (hidden 640, 4 q heads,
    1 KV head, head_dim 256, intermediate 2048). Device time per call from CUDA-graph
    replays (launch cost excluded) and eager wall time per call (launch cost included)."""
    from aserve.kernels import fused
    from aserve.models.layers import RMSNorm, add_norm, apply_rotary

    dt = getattr(torch, dtype)
    hidden, h, hkv, d, inter = 640, 4, 1, 256, 2048
    gen = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=dt)

    norm = RMSNorm(hidden, 1e-6, gemma=True).to(device=device, dtype=dt)
    x_norm = RMSNorm(hidden, 1e-6, gemma=True).to(device=device, dtype=dt)
    q_norm = RMSNorm(d, 1e-6, gemma=True).to(device=device, dtype=dt)
    k_norm = RMSNorm(d, 1e-6, gemma=True).to(device=device, dtype=dt)
    for m in (norm, x_norm, q_norm, k_norm):
        m.weight.data.normal_(generator=gen)
    rows: list[dict[str, Any]] = []

    def cases_for(t: int) -> tuple[tuple[str, Any, Any], ...]:
        x, res = rnd(t, hidden), rnd(t, hidden)
        gu = rnd(t, 2 * inter)
        qkv = rnd(t, (h + 2 * hkv) * d)
        cos, sin = rnd(t, 1, d), rnd(t, 1, d)
        slots = torch.randperm(4 * t, generator=gen, device=device)[:t]
        k_cache, v_cache = rnd(4 * t, hkv, d), rnd(4 * t, hkv, d)

        def add_rms() -> Any:
            return add_norm(x, res, norm, x_norm)

        def gated_eager() -> torch.Tensor:
            return torch.nn.functional.gelu(gu[:, :inter], approximate="tanh") * gu[:, inter:]

        def qkv_eager() -> torch.Tensor:
            q, k, v = (u.view(t, -1, d) for u in qkv.split([h * d, hkv * d, hkv * d], dim=1))
            q, k = apply_rotary(q_norm(q), cos, sin), apply_rotary(k_norm(k), cos, sin)
            k_cache[slots] = k
            v_cache[slots] = v
            return q

        def add_rms_fused() -> Any:
            return fused.add_rmsnorm(x, res, norm.weight, 1e-6, True, x_norm.weight)

        def gated_fused() -> torch.Tensor:
            return fused.gated(gu[:, :inter], gu[:, inter:], "gelu_tanh")

        def qkv_fused() -> torch.Tensor:
            return fused.qkv_prep(qkv, h, hkv, d, q_norm.weight, k_norm.weight, 1e-6, True, cos, sin, slots,
                                  k_cache, v_cache)  # fmt: skip

        return (("add_rmsnorm (sandwich)", add_rms, add_rms_fused), ("gated gelu", gated_eager, gated_fused),
                ("q/k norm + rotary + KV write", qkv_eager, qkv_fused))  # fmt: skip

    for t in tokens:
        cases = cases_for(t)
        for name, eager, fused_fn in cases:
            row: dict[str, Any] = {"op": name, "tokens": t}
            with torch.inference_mode():
                variants = [("eager", eager), ("triton", fused_fn)]
                if compile_ops:
                    variants.append(("compile", torch.compile(eager, dynamic=False)))
                for label, fn in variants:
                    row[f"{label}_device_us"] = graph_time_us(fn, device)
                    row[f"{label}_wall_us"] = _eager_time_us(fn, device)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows

"""The served path against the engine in process: ``aserve serve`` with and without front-end
processes, on the same work, with the client spread over several processes.

    python -m aserve.bench.served --out served.json [--api-workers 0,default] [--client-procs 8]
        [--requests 512] [--concurrency 256] [--len 256] [--repeats 3] [--rates 8,32,128]
        [--trace-dir DIR]   # the engine's and each server's step trace (Perfetto), for idle hunting

Random weights in the Gemma 3 270M shape (``--tiny`` for a CPU smoke run). For each setting:
output tok/s, failed streams, and the device's busy / idle time from the server's own counters
over the run; then W3 (Poisson arrivals) TTFT / ITL. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from loadgen.procstat import tree_cpu
from loadgen.server_view import from_engine_stats


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loadgen(args: list[str], out: Path, label: str, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "loadgen", "run", *args, "--no-progress", "--no-plots", "--out", str(out),
           "--label", label]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, timeout=1200)
    return dict(json.loads((out / f"{label}.json").read_text()))


def _model_path(model: str | None, work: Path, tokenizer_dir: str, shape: str = "gemma3-270m") -> Path:
    """``model`` (a checkpoint directory), else random weights of ``shape`` built under ``work``."""
    if model:
        return Path(model)
    from aserve.bench.checkpoints import build_checkpoint

    if not (Path(tokenizer_dir) / "tokenizer.model").is_file():
        raise SystemExit(
            f"no tokenizer.model in --tokenizer-dir {tokenizer_dir}: the random-weight checkpoint needs the "
            "model's sentencepiece tokenizer there (or give --model DIR)"
        )
    path, _ = build_checkpoint(shape, work, Path(tokenizer_dir))
    return path


def _wait_ready(base: str, server: subprocess.Popen[bytes], log: Path, timeout_s: float = 600) -> None:
    """Until ``base``/health answers 200; fails if the server exits first (see ``log``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.poll() is None, f"server exited: see {log}"
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server not ready"
        time.sleep(0.5)


def _row(label: str, s: dict[str, Any]) -> dict[str, Any]:
    server = s.get("server") or {}
    busy, gap = server.get("device_busy_s"), server.get("device_gap_s")
    return {
        "label": label,
        "output_tok_s": s["throughput"]["output_tok_per_s"],
        "completed": s["requests"]["completed"],
        "failed": s["requests"]["failed"],
        "device_busy_s": busy,
        "device_gap_s": gap,
        "device_idle_fraction": server.get("device_gap_fraction"),
        "ttft_p50_ms": s["latency_s"]["ttft"]["p50"] * 1e3,
        "ttft_p99_ms": s["latency_s"]["ttft"]["p99"] * 1e3,
        "itl_p50_ms": s["latency_s"]["itl"]["p50"] * 1e3,
        # The client's own event loop lag (loadgen's check that the client is not the limit).
        "client_loop_lag_p99_ms": _ms((s.get("client") or {}).get("loop_lag_s", {}).get("p99")),
        # How far apart the client processes were ready to send (they start together regardless).
        "client_ready_spread_ms": _ms(s["run"].get("ready_spread_s")),
        # Cores the client processes kept busy, and the whole host's busy share over the run:
        # client and server share this host's CPUs.
        "client_cores": (s.get("client") or {}).get("cores"),
        "host_busy": (s.get("host") or {}).get("busy_fraction"),
        **_per_step(server),
    }


def _per_step(counters: dict[str, float]) -> dict[str, Any]:
    """The core's steps over a run, and per step its host time (plan, launch and commit, from
    its own counters; ``loadgen.server_view``'s keys) and the device's idle: a run whose host
    time a step is near or above the device's step time is host-bound, and more steps for the
    same tokens means smaller ones."""
    steps = counters.get("engine_steps")
    host = [counters.get(k) for k in ("host_plan_s", "host_launch_s", "host_commit_s", "device_gap_s")]
    if not steps or any(v is None for v in host):
        return {}
    plan, launch, commit, gap = (float(v or 0.0) for v in host)
    return {"steps": int(steps), "host_us_per_step": (plan + launch + commit) / steps * 1e6,
            "gap_us_per_step": gap / steps * 1e6}  # fmt: skip


def _server_cpu(root: int, before: dict[int, float], after: dict[int, float], wall_s: float) -> dict[str, Any]:
    """Where the server's CPU went over one run (read around its loadgen process's life; the
    server is idle outside ``wall_s``, the run's first send to its last token): the core
    (``aserve serve`` itself) and each child (the front ends, and multiprocessing's helper), as
    fractions of one core over the run. A front end near 1.0 is the limit; the core near 1.0
    is its loop."""
    used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    children = sorted((v for pid, v in used.items() if pid != root), reverse=True)
    return {"core_cpu_s": used.get(root, 0.0), "children_cpu_s": children,
            "core_busy": used.get(root, 0.0) / wall_s, "front_end_busy_max": (children[0] / wall_s) if children else 0.0}  # fmt: skip


def _busy(r: dict[str, Any]) -> str:
    if "core_busy" not in r:
        return ""
    return f"{100 * r['core_busy']:.0f}% / {100 * r['front_end_busy_max']:.0f}%"


def _num(value: float | None, scale: float, unit: str = "") -> str:
    return "" if value is None else f"{value * scale:.1f}{unit}"


def _ms(seconds: float | None) -> float:
    return float("nan") if seconds is None else seconds * 1e3


def engine_direct(
    path: Path,
    n: int,
    conc: int,
    ln: int,
    device: str,
    repeats: int = 1,
    trace_path: str | None = None,
    options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The engine embedded, no client at all: ``n`` ``complete`` calls, ``conc`` at a time, run
    ``repeats`` times on one engine (the ceiling a served path is measured against; the
    in-process loadgen run also pays for its client's per-token work on the same loop)."""
    import random

    import anyio

    import aserve

    async def once(engine: aserve.Engine, prompts: list[list[int]], label: str) -> dict[str, Any]:
        params = aserve.SamplingParams(max_tokens=ln, temperature=0, ignore_eos=True)
        sem = anyio.Semaphore(conc)
        tokens = 0

        async def one(p: list[int]) -> None:
            nonlocal tokens
            async with sem:
                got = len((await engine.complete(p, params)).token_ids)
            tokens += got  # read after the await: `tokens += len(await ...)` loses updates

        engine.reset_stats()
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for p in prompts:
                tg.start_soon(one, p)
        wall = time.perf_counter() - t0
        st = engine.stats()
        busy, gap = st.device_busy_s, st.device_gap_s
        return {"label": label, "output_tok_s": tokens / wall, "completed": n, "failed": 0,
                "device_busy_s": busy, "device_gap_s": gap, "device_idle_fraction": gap / (busy + gap),
                "ttft_p50_ms": float("nan"), "ttft_p99_ms": float("nan"), "itl_p50_ms": float("nan"),
                **_per_step(from_engine_stats(st))}  # fmt: skip

    async def run() -> list[dict[str, Any]]:
        dtype = "bfloat16" if device == "cuda" else "float32"
        base = {"model": str(path), "device": device, "dtype": dtype, "max_running_requests": conc,
                "trace_path": trace_path}  # fmt: skip
        async with aserve.Engine(**{**base, **(options or {})}) as engine:
            rng = random.Random(1)
            vocab = engine.model_config.vocab_size
            prompts = [[rng.randrange(3, vocab) for _ in range(ln)] for _ in range(n)]
            # The prefix cache is flushed between runs: each run prefills its prompts, as a
            # served run's fresh prompts do.
            rows = []
            for rep in range(repeats):
                engine.flush_cache()
                rows.append(await once(engine, prompts, f"engine.complete, no client (run {rep + 1})"))
            return rows

    return anyio.run(run)


def bench_parser(
    doc: str | None, out: str, model_default: str = "random Gemma 3 270M shape"
) -> argparse.ArgumentParser:
    """The arguments the served-path benches share: where results go and which checkpoint."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=out)
    ap.add_argument("--work-dir", default="/tmp/aserve-bench")
    ap.add_argument(
        "--tokenizer-dir", default=".gpu", help="a folder with the model's tokenizer.model (default: %(default)s)"
    )
    ap.add_argument("--model", default=None, help=f"a checkpoint directory (default: {model_default})")
    return ap


def main() -> int:
    ap = bench_parser(__doc__, "served.json")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and sizes (CPU smoke run)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--api-workers",
        default="0,default",
        help="front-end process counts to compare; 'default': the server's own choice (no flag)",
    )
    # Half the cores, at most 8: on the H100 host four client processes lagged 28-113 ms (loop
    # lag p99) at ~50k tok/s, so the client, not the server, set the served figure.
    ap.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--len", type=int, default=256, help="prompt and output length")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--rates", default="8,32,128", help="W3 Poisson rates (empty: skip)")
    ap.add_argument("--w3-requests", type=int, default=200)
    ap.add_argument("--server-arg", action="append", default=[])
    ap.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="an engine option for every run: the engine's, the in-process one's and the server's "
                    "(as --key value), e.g. cuda_event_wait=spin (repeatable)")  # fmt: skip
    ap.add_argument("--trace-dir", default=None, help="write the engine's and each server's step trace here")
    a = ap.parse_args()
    work = Path(a.work_dir)
    runs = work / "served-runs"
    runs.mkdir(parents=True, exist_ok=True)
    path = _model_path(a.model, work, a.tokenizer_dir, "tiny-gemma3" if a.tiny else "gemma3-270m")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    n, conc, ln = a.requests, a.concurrency, a.len
    work_args = ["--workload", "random", "--num-requests", str(n), "--input-len", str(ln), "--output-len", str(ln),
                 "--seed", "1", "--tokenizer", str(path)]  # fmt: skip
    engine_opts = [f"max_running_requests={conc}", f"device={a.device}", "dtype=bfloat16" if a.device == "cuda" else
                   "dtype=float32", *a.engine_opt]  # fmt: skip
    from aserve.bench.gpu_workloads import cli_flags, parse_engine_opts

    options = parse_engine_opts(a.engine_opt)
    server_flags = cli_flags(options)
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
                              "torch": torch.__version__, "model": str(path), "engine_opts": options, "rows": rows,
                              "w3": []}  # fmt: skip
    if a.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()

    def save() -> None:
        Path(a.out).write_text(json.dumps(result, indent=1))

    trace_dir = Path(a.trace_dir) if a.trace_dir else None
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
    direct = engine_direct(path, n, conc, ln, a.device, a.repeats,
                           None if trace_dir is None else str(trace_dir / "engine_trace.json"), options)  # fmt: skip
    rows.extend(direct)
    # Served runs are compared with the engine's median run: one run of 512 requests moves by
    # up to 20% from run to run (how the two waves' prefill meets the decodes).
    result["engine_median_tok_s"] = statistics.median(r["output_tok_s"] for r in direct)
    save()
    # The engine in this machine's own process, the same requests, the same concurrency.
    eng_args = ["--engine", "--engine-opt", f"model={path}"]
    for opt in engine_opts:
        eng_args += ["--engine-opt", opt]
    s = _loadgen([*eng_args, *work_args, "--rate", "inf", "--max-concurrency", str(conc)], runs, "in_process", env)
    rows.append(_row("in-process engine", s))
    save()
    for tag in [w.strip() for w in a.api_workers.split(",") if w.strip()]:
        flag, workers = ["--api-workers", tag], tag
        if tag == "default":  # what a user gets without the flag: default_api_workers's choice
            from aserve.config import EngineConfig
            from aserve.ipc.launcher import default_api_workers

            flag, workers = [], f"default ({default_api_workers(EngineConfig(model=str(path), device=a.device))})"
        port = _port()
        base = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "aserve", "serve", "--model", str(path), "--port", str(port),
               "--served-model-name", "bench", "--max-running-requests", str(conc), "--device", a.device,
               *flag, *server_flags, *a.server_arg]  # fmt: skip
        if trace_dir is not None:
            cmd += ["--trace-path", str(trace_dir / f"server_w{tag}_trace.json")]
        log = open(runs / f"server_w{tag}.log", "wb")  # noqa: SIM115 - closed below
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_ready(base, server, runs / f"server_w{tag}.log")
            # Chunks carry their token ids: the client counts them (exactly) instead of
            # tokenizing each chunk's text.
            http_args = ["--base-url", base, "--model", "bench", "--ready-timeout", "600", "--return-token-ids"]
            for rep in range(a.repeats):
                label = f"served_w{tag}_r{rep}"
                httpx.post(base + "/admin/flush_cache", timeout=30).raise_for_status()  # as the engine's runs
                cpu0 = tree_cpu(server.pid)
                s = _loadgen([*http_args, *work_args, "--rate", "inf", "--max-concurrency", str(conc),
                              "--client-procs", str(a.client_procs)], runs, label, env)  # fmt: skip
                row = _row(f"serve --api-workers {workers} (run {rep + 1})", s)
                row.update(_server_cpu(server.pid, cpu0, tree_cpu(server.pid), s["duration_s"]))
                rows.append(row)
                save()
            for rate in [float(r) for r in a.rates.split(",") if r.strip()]:
                label = f"w3_w{tag}_rate{rate:g}"
                s = _loadgen([*http_args, "--workload", "random", "--num-requests", str(a.w3_requests), "--input-len",
                              str(ln), "--output-len", str(ln), "--seed", "2", "--tokenizer", str(path), "--rate",
                              str(rate), "--client-procs", str(a.client_procs)], runs, label, env)  # fmt: skip
                result["w3"].append({"api_workers": workers, "rate": rate, **_row(label, s)})
                save()
        finally:
            server.terminate()
            server.wait(timeout=120)
            log.close()
    save()
    print(f"\n{'run':<40} {'tok/s':>10} {'vs engine':>9} {'failed':>6} {'idle%':>6} {'ttft p50':>9} "
          f"{'client lag p99':>14} {'core/FE max CPU':>16} {'client cores':>12} {'host busy':>9} {'steps':>6} "
          f"{'host us/step':>12} {'gap us/step':>11}")  # fmt: skip
    ref = result["engine_median_tok_s"]
    for r in rows:
        idle = r["device_idle_fraction"]
        print(f"{r['label']:<40} {r['output_tok_s']:>10,.0f} {r['output_tok_s'] / ref:>9.2f} {r['failed']:>6} "
              f"{'' if idle is None else f'{100 * idle:.1f}':>6} {r['ttft_p50_ms']:>8.1f}ms "
              f"{r.get('client_loop_lag_p99_ms', float('nan')):>12.1f}ms "
              f"{_busy(r):>16} {_num(r.get('client_cores'), 1):>12} {_num(r.get('host_busy'), 100, '%'):>9} "
              f"{r.get('steps', ''):>6} {_num(r.get('host_us_per_step'), 1):>12} {_num(r.get('gap_us_per_step'), 1):>11}")  # fmt: skip
    for r in result["w3"]:
        print(f"W3 api-workers={r['api_workers']} rate={r['rate']:g}: {r['output_tok_s']:,.0f} tok/s, TTFT p50/p99 "
              f"{r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms, ITL p50 {r['itl_p50_ms']:.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

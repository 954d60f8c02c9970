"""Structured outputs on a CPU: JSON-schema decoding against free decoding, same engine and run.

    python -m aserve.bench.cpu_structured --out cpu_structured.json [--streams 1,16] [--threads 2]

The default model (Gemma 3 270M, GGUF) in one engine; for each stream count and decoding mode
(greedy; temperature 1 over the whole vocabulary; temperature 1 with top-k 40) the same
requests free and constrained by a JSON schema that cannot close within ``--tokens`` (an
array of 200 integers, as the GPU's structured bench), ``ignore_eos``, so both make as many
tokens. ``--torch-masks`` also runs the constrained requests with the grammar masks applied by
torch's ops instead of the C pass (``apply_masks_``), the way before it. Prints a table and
writes JSON: output tokens per second, and the ratio constrained / free.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import anyio

import aserve
from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.sampling import sampler as sampler_mod

MODES = {"greedy": (0.0, 0), "T=1": (1.0, 0), "T=1 top-k 40": (1.0, 40)}


async def _rate(engine: aserve.Engine, streams: int, tokens: int, temp: float, top_k: int, json_schema: bool) -> float:
    so = aserve.StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA) if json_schema else None
    params = aserve.SamplingParams(max_tokens=tokens, temperature=temp, top_k=top_k, seed=1, ignore_eos=True,
                                   structured_outputs=so)  # fmt: skip
    made: list[int] = []

    async def one(i: int) -> None:
        out = (await engine.complete(f"Numbers {i}:", params)).outputs[0]
        made.append(len(out.token_ids))

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(streams):
            tg.start_soon(one, i)
    return sum(made) / (time.perf_counter() - t0)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    async with aserve.Engine(model="gemma-3-270m", num_threads=args.threads) as engine:
        await _rate(engine, 2, 8, 0.0, 0, True)  # the grammar tokenizer and first masks
        # With ASERVE_GRAMMAR_FSM=1, the schema's token automaton (built beside the engine).
        await engine.prepare_structured_outputs(aserve.StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA))
        for streams in (int(s) for s in args.streams.split(",")):
            for mode, (temp, top_k) in MODES.items():
                free = await _rate(engine, streams, args.tokens, temp, top_k, False)
                bound = await _rate(engine, streams, args.tokens, temp, top_k, True)
                row = {"streams": streams, "mode": mode, "free_tok_s": free, "json_tok_s": bound, "ratio": bound / free}
                if args.torch_masks:
                    kernel = sampler_mod._cpu_kernel
                    sampler_mod._cpu_kernel = lambda: None  # type: ignore[assignment]
                    try:
                        torch_masks = await _rate(engine, streams, args.tokens, temp, top_k, True)
                    finally:
                        sampler_mod._cpu_kernel = kernel  # type: ignore[assignment]
                    row.update(json_torch_masks_tok_s=torch_masks, ratio_torch_masks=torch_masks / free)
                rows.append(row)
                extra = f"  (torch masks {row['ratio_torch_masks']:.2f}x)" if args.torch_masks else ""
                print(f"{streams:7d} {mode:14s} {free:9.1f} {bound:9.1f} {row['ratio']:6.2f}x{extra}", flush=True)
    return {"rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch-masks", action="store_true")
    ap.add_argument("--out", default="cpu_structured.json")
    args = ap.parse_args()
    print(f"{'streams':>7s} {'mode':14s} {'free':>9s} {'json':>9s} {'ratio':>7s}   (output tok/s)")
    results = anyio.run(_run, args)
    results.update(
        date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        machine={"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        threads=args.threads,
        tokens=args.tokens,
        aserve=aserve.__version__,
    )
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

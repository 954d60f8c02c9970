"""Session 22: what a 256-row step's grammar advance costs on the host, serial against
llguidance's pool (``consume_token_par``) at several thread counts, beside the fill.

The rows replay the structured bench schema's seeded random walks (aserve.bench.mask_fill's),
templates as the engine hands them out; per step: the fill (``MaskFiller.fill``, the engine's
mask cache on) and the advance (``advance_all``; the pool's call timed alone too). Medians of
steps 20-59, configurations taking turns, 3 rounds. JSON to --out."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import aserve  # noqa: F401  (before torch)
import torch

from aserve.bench import mask_fill as mf
from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.sampling import masks
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import MaskCache, MaskFiller, advance_all, mask_words
from aserve.sampling_params import StructuredOutputs

mf.STEPS, mf.WARMUP = 60, 20


class Timed:
    """The pool, its consume call timed."""

    def __init__(self, pool: object, times: list[float]) -> None:
        self.pool, self.times = pool, times

    def consume_token_par(self, rows: list) -> list[bool]:
        t0 = time.perf_counter()
        try:
            return self.pool.consume_token_par(rows)  # type: ignore[attr-defined]
        finally:
            self.times.append(time.perf_counter() - t0)

    def unsafe_compute_mask_ptr(self, *a: object) -> None:
        self.pool.unsafe_compute_mask_ptr(*a)  # type: ignore[attr-defined]


def run(g: Grammars, spec: StructuredOutputs, walks: list[list[int]], fill: str, pool_advance: bool) -> dict:
    filler = MaskFiller(fill)
    consume: list[float] = []
    if filler.kind == "executor":
        filler._executor = Timed(filler._pool(), consume)
    masks._MIN_POOL_ADVANCE = 128 if pool_advance else 10**9
    g.masks = MaskCache()
    states = [g.state(spec, filler) for _ in walks]
    words = mask_words(g.vocab_size)
    out = torch.empty((len(walks), words), dtype=torch.int32)
    fills, advances = [], []
    for step in range(mf.STEPS):
        live = [(i, st) for i, st in enumerate(states) if step < len(walks[i])]
        t0 = time.perf_counter()
        filler.fill([st for _, st in live], out.data_ptr(), words * 4)
        t1 = time.perf_counter()
        ok = advance_all([st for _, st in live], [walks[i][step] for i, _ in live])
        t2 = time.perf_counter()
        assert all(ok)
        fills.append(t1 - t0)
        advances.append(t2 - t1)
    res = {"fill_ms": statistics.median(fills[mf.WARMUP:]) * 1e3,
           "advance_ms": statistics.median(advances[mf.WARMUP:]) * 1e3}  # fmt: skip
    if consume:
        res["consume_par_ms"] = statistics.median(consume[len(consume) // 3 :]) * 1e3
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--threads", default="2,4,8,16")
    ap.add_argument("--out", default="advance_par.json")
    args = ap.parse_args()
    tok = mf._tokenizer(args.tokenizer_dir)
    g = Grammars(tok, 262144 if args.tokenizer_dir is None else tok.vocab_size, native_tokens=True)
    spec = StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    walks = mf.record_walks(g, spec, args.rows)
    configs = [("serial", False)]
    for n in args.threads.split(","):
        configs += [(f"executor:{n}", True), (f"executor:{n}", False)]

    def name(f: str, p: bool) -> str:
        return f if f == "serial" else f"{f} advance {'pool' if p else 'serial'}"

    res: dict[str, list[dict]] = {name(*c): [] for c in configs}
    for _ in range(3):
        for c in configs:
            res[name(*c)].append(run(g, spec, walks, *c))
    print(f"{args.rows} rows, ms a step (median of 3 rounds; each a median of steps 20-59)")
    table = {}
    for k, runs in res.items():
        table[k] = {m: statistics.median(r[m] for r in runs) for m in runs[0]}
        print(f"  {k:32s} " + "  ".join(f"{m} {v:6.3f}" for m, v in table[k].items()))
    with open(args.out, "w") as fh:
        json.dump({"rows": args.rows, "table": table, "runs": res}, fh, indent=1)


if __name__ == "__main__":
    main()

"""Session 21: would xgrammar's masks be cheaper than llguidance's for issue 16's bench?

Not part of aserve (xgrammar is not a dependency): a measurement for choosing. 256 rows of the
structured bench's schema (an array of 200 integers) follow seeded random walks recorded with
llguidance (aserve.bench.mask_fill.record_walks, 60 steps); both engines replay them on the
default model's vocabulary (Gemma 3, 262,144 tokens), and each step's fill of all rows' masks
and advance by their tokens is timed (median of steps 20-59): llguidance serially and on its
pool (the engine's MaskFiller, 4 templates a thread), xgrammar serially (one
GrammarMatcher.fill_next_token_bitmask a row) and with BatchGrammarMatcher. A row xgrammar
refuses a walk's token on is counted (the two engines' JSON grammars may differ in
whitespace; with aserve's layout given to both, a check over 16 walks found them equal but
for one token in some rows, a second token with the same bytes that xgrammar allows).
Run with xgrammar importable: PYTHONPATH=<unpacked wheels> python this.py."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import aserve  # noqa: F401  (before torch)
import torch
import xgrammar as xgr

from aserve.bench import mask_fill as mf
from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import MaskCache, MaskFiller, advance_all, mask_words
from aserve.sampling_params import StructuredOutputs

mf.STEPS, mf.WARMUP = 60, 20


def llguidance_run(g: Grammars, spec: StructuredOutputs, walks: list[list[int]], fill: str) -> dict[str, float]:
    filler = MaskFiller(fill)
    g.masks = MaskCache()
    states = [g.state(spec, filler, cached=False) for _ in walks]
    words = mask_words(g.vocab_size)
    out = torch.empty((len(walks), words), dtype=torch.int32)
    fills, advances = [], []
    for step in range(mf.STEPS):
        t0 = time.perf_counter()
        filler.fill(states, out.data_ptr(), words * 4)
        t1 = time.perf_counter()
        assert all(advance_all(states, [w[step] for w in walks]))
        fills.append(t1 - t0)
        advances.append(time.perf_counter() - t1)
    return {"fill_ms": statistics.median(fills[mf.WARMUP :]) * 1e3,
            "advance_ms": statistics.median(advances[mf.WARMUP :]) * 1e3}  # fmt: skip


def xgrammar_run(compiled: xgr.CompiledGrammar, walks: list[list[int]], vocab: int, batch: int) -> dict[str, float]:
    matchers = [xgr.GrammarMatcher(compiled) for _ in walks]
    bitmask = xgr.allocate_token_bitmask(len(walks), vocab)
    batcher = xgr.BatchGrammarMatcher(batch) if batch else None
    fills, advances, refused = [], [], 0
    live = list(range(len(walks)))
    for step in range(mf.STEPS):
        t0 = time.perf_counter()
        if batcher is None:
            for i in live:
                matchers[i].fill_next_token_bitmask(bitmask, i)
        else:
            batcher.batch_fill_next_token_bitmask([matchers[i] for i in live], bitmask, live)
        t1 = time.perf_counter()
        keep = []
        for i in live:
            if matchers[i].accept_token(walks[i][step]):
                keep.append(i)
            else:
                refused += 1
        live = keep
        fills.append(t1 - t0)
        advances.append(time.perf_counter() - t1)
    return {"fill_ms": statistics.median(fills[mf.WARMUP :]) * 1e3,
            "advance_ms": statistics.median(advances[mf.WARMUP :]) * 1e3, "refused_rows": refused}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="xgrammar_vs_llguidance.json")
    args = ap.parse_args()
    tok = mf._tokenizer(args.tokenizer_dir)
    vocab = 262144 if args.tokenizer_dir is None else tok.vocab_size
    g = Grammars(tok, vocab, native_tokens=True)
    spec = StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    walks = mf.record_walks(g, spec, args.rows)
    assert all(len(w) == mf.STEPS for w in walks)
    token_bytes = tok.token_bytes()
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo([token_bytes[i] for i in range(vocab)], xgr.VocabType.RAW, vocab_size=vocab,
                             stop_token_ids=list(tok.eos_token_ids))  # fmt: skip
    t1 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, max_threads=args.threads).compile_json_schema(
        json.dumps(STRUCTURED_BENCH_SCHEMA), any_whitespace=False, separators=(", ", ": ")
    )  # aserve's JSON layout for llguidance (grammar._JSON_LAYOUT)
    t2 = time.perf_counter()
    print(f"xgrammar: tokenizer info {t1 - t0:.2f} s, schema compiled in {t2 - t1:.2f} s")
    configs = {
        "llguidance serial": lambda: llguidance_run(g, spec, walks, "serial"),
        f"llguidance executor:{args.threads}": lambda: llguidance_run(g, spec, walks, f"executor:{args.threads}"),
        "xgrammar serial": lambda: xgrammar_run(compiled, walks, vocab, 0),
        f"xgrammar batch:{args.threads}": lambda: xgrammar_run(compiled, walks, vocab, args.threads),
    }
    res: dict[str, list[dict[str, float]]] = {k: [] for k in configs}
    for _ in range(3):
        for k, fn in configs.items():
            res[k].append(fn())
    print(f"{args.rows} rows, ms a step (median of 3 rounds; each the median of steps 20-59)")
    table = {}
    for k, runs in res.items():
        table[k] = {m: statistics.median(r[m] for r in runs) for m in runs[0]}
        print(f"  {k:26s} " + "  ".join(f"{m} {v:.3f}" for m, v in table[k].items()))
    with open(args.out, "w") as fh:
        json.dump({"rows": args.rows, "vocab": vocab, "table": table, "runs": res,
                   "compile_s": t2 - t1, "tokenizer_info_s": t1 - t0}, fh, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()

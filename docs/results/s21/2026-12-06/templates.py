"""Session 21: does the mask fill scale with threads when every row has its own lexer?

llguidance's matchers deep-copied from one template share its lexer behind a lock; the engine
compiles one template per fill thread and groups a step's rows by template. Here 256 rows of
the structured bench's schema replay seeded random walks (aserve.bench.mask_fill's), and the
fill and the advance are timed per step (median of steps 20-59) for: serial; executor:N with
k templates per thread (``grammar.TEMPLATES_PER_THREAD``: 1 was the engine's, call 3; k = 1,
4, 16 in call 4); executor:N with a fresh matcher per row (its own lexer, no lock shared with
any other row). Configurations take turns, 3 rounds. JSON to --out."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import aserve  # noqa: F401  (before torch)
import llguidance
import torch

from aserve.bench import mask_fill as mf
from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.sampling import grammar as grammar_mod
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import MaskCache, MaskFiller, advance_all, mask_words
from aserve.sampling_params import StructuredOutputs

mf.STEPS, mf.WARMUP = 60, 20


def run(g: Grammars, spec: StructuredOutputs, walks: list[list[int]], fill: str, per_row: bool, k: int) -> dict:
    grammar_mod.TEMPLATES_PER_THREAD = k
    filler = MaskFiller(fill)
    g.masks = MaskCache()
    states = [g.state(spec, filler, cached=False) for _ in walks]
    if per_row:
        grammar = g._compiled(spec).grammar
        for i, st in enumerate(states):
            st.matcher = llguidance.LLMatcher(g._ll(), grammar, log_level=0)
            st.shard = i
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
    return {"fill_ms": statistics.median(fills[mf.WARMUP:]) * 1e3,
            "advance_ms": statistics.median(advances[mf.WARMUP:]) * 1e3}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--threads", default="8,16")
    ap.add_argument("--per-thread", default="1", help="comma list of templates per thread")
    ap.add_argument("--out", default="templates.json")
    args = ap.parse_args()
    tok = mf._tokenizer(args.tokenizer_dir)
    g = Grammars(tok, 262144 if args.tokenizer_dir is None else tok.vocab_size, native_tokens=True)
    spec = StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    walks = mf.record_walks(g, spec, args.rows)
    configs = [("serial", False, 1)]
    for n in args.threads.split(","):
        configs += [(f"executor:{n}", False, int(k)) for k in args.per_thread.split(",")]
        configs.append((f"executor:{n}", True, 1))

    def name(f: str, p: bool, k: int) -> str:
        return f if f == "serial" else f"{f} {'per-row' if p else f'{k}/thread'}"

    res: dict[str, list[dict]] = {name(*c): [] for c in configs}
    for _ in range(3):
        for c in configs:
            res[name(*c)].append(run(g, spec, walks, *c))
    print(f"{args.rows} rows, fill and advance ms a step (median of 3 rounds; each a median of steps 20-59)")
    table = {}
    for k, runs in res.items():
        table[k] = {m: statistics.median(r[m] for r in runs) for m in ("fill_ms", "advance_ms")}
        print(f"  {k:22s} fill {table[k]['fill_ms']:7.3f}  advance {table[k]['advance_ms']:7.3f}")
    with open(args.out, "w") as fh:
        json.dump({"rows": args.rows, "table": table, "runs": res}, fh, indent=1)


if __name__ == "__main__":
    main()

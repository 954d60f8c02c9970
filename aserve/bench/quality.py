"""Quality of the GGUF-block CPU path against the float32 path, teacher-forced, same run.

    python -m aserve.bench.quality --out docs/results/quality.json

The corpus is the docstrings of a fixed list of Python standard-library modules (English
prose with some code, shipped with every Python), tokenized with the model's tokenizer and
cut into windows of ``--window`` tokens, each starting with BOS. Every engine scores the same
windows: for each position, the next token's log-probability (perplexity) and its top-1
prediction. Agreement is the share of positions whose top-1 equals the float32 path's.
llama.cpp (``llama-cpp-python``, when installed) scores the same token ids for comparison.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aserve.attention.metadata import build_metadata
from aserve.models.causal_lm import CausalLM
from aserve.models.loader import load_model, resolve_model_path

# Stable, prose-heavy modules; their docstrings change little between Python versions.
CORPUS_MODULES = [
    "argparse", "asyncio", "collections", "concurrent.futures", "contextlib", "csv", "dataclasses", "datetime",
    "decimal", "difflib", "email", "enum", "fractions", "functools", "heapq", "html", "http.client",
    "inspect", "ipaddress", "itertools", "json", "logging", "pathlib", "pickle", "random", "re", "shutil",
    "sqlite3", "statistics", "string", "subprocess", "tarfile", "textwrap", "threading", "typing",
    "unittest", "urllib.parse", "uuid", "zipfile",
]  # fmt: skip
HEAD_CHUNK = 128  # positions whose logits are materialised at once ([128, vocab] float32)


def corpus_text() -> str:
    """Module, class and function docstrings of ``CORPUS_MODULES``, in a fixed order."""
    parts: list[str] = []
    for name in CORPUS_MODULES:
        mod = importlib.import_module(name)
        parts.append(inspect.getdoc(mod) or "")
        for attr in sorted(vars(mod)):
            obj = getattr(mod, attr)
            if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                doc = inspect.getdoc(obj)
                if doc:
                    parts.append(f"{attr}: {doc}")
    return "\n\n".join(p for p in parts if p)


def windows(ids: list[int], bos: int, window: int, tokens: int) -> list[list[int]]:
    """Windows of ``window`` ids (BOS + text) until ``tokens`` next-token predictions are covered."""
    step = window - 1
    out: list[list[int]] = []
    for start in range(0, len(ids) - step + 1, step):
        if len(out) * (window - 1) >= tokens:
            break
        out.append([bos, *ids[start : start + step]])
    if len(out) * (window - 1) < tokens:
        raise ValueError(f"the corpus has {len(ids)} tokens, fewer than the {tokens} asked for")
    return out


Scorer = Callable[[list[int]], tuple[torch.Tensor, torch.Tensor]]


def aserve_scorer(gguf_blocks: bool, head_int8: bool = False, gemm_bf16: bool = False) -> Scorer:
    """ids -> (log-prob of each next token [L-1] float64, top-1 prediction [L-1]) on one engine
    (``head_int8``: the LM head with 8-bit activations, ``EngineConfig(gguf_head="int8")``;
    ``gemm_bf16``: matmuls of 32 rows and more in bfloat16, ``gguf_prefill="bfloat16"``: every
    window here is one prefill, so every position gets them, where serving decodes in float32)."""
    cfg, model, _ = load_model("gemma-3-270m", torch.float32, torch.device("cpu"), gguf_blocks=gguf_blocks)
    assert isinstance(model, CausalLM), type(model)
    if gemm_bf16:
        from aserve.kernels.gguf_linear import GGUFLinear

        for m in model.modules():
            if isinstance(m, GGUFLinear):
                m.gemm_bf16 = True
    if head_int8:
        from aserve.engine.setup import lm_head_blocks

        head = lm_head_blocks(model)
        assert head is not None, "the default model's head is GGUF blocks"
        head.set_int8_activations()
    causal_lm = model

    @torch.no_grad()
    def score(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(ids)
        shape = (n + 1, cfg.num_kv_heads, cfg.head_dim)
        kv = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]
        table = torch.arange(1, n + 1, dtype=torch.int64)[None, :]  # slot 0 unused, like the engine
        meta = build_metadata(table, [0], [0], [n], "cpu")
        x = causal_lm.hidden(torch.tensor(ids), meta, kv)  # [L, hidden]
        target = torch.tensor(ids[1:])
        lp, top = [], []
        for s in range(0, n - 1, HEAD_CHUNK):
            logits = causal_lm.logits(x[s : min(s + HEAD_CHUNK, n - 1)])  # [C, vocab]
            lp.append(torch.log_softmax(logits.double(), -1).gather(1, target[s : s + len(logits), None])[:, 0])
            top.append(logits.argmax(-1))
        return torch.cat(lp), torch.cat(top)

    return score


def llama_cpp_scorer(window: int, threads: int) -> Scorer | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(str(resolve_model_path("gemma-3-270m")), n_ctx=window, n_threads=threads, n_batch=window,
                logits_all=True, verbose=False)  # fmt: skip

    def score(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        llm.reset()
        llm.eval(ids)
        logits = torch.from_numpy(llm.scores[: len(ids) - 1].copy())  # [L-1, vocab]
        target = torch.tensor(ids[1:])
        lp = torch.log_softmax(logits.double(), -1).gather(1, target[:, None])[:, 0]
        return lp, logits.argmax(-1)

    return score


def run(name: str, scorer: Scorer, wins: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, float]:
    t0 = time.perf_counter()
    lps, tops = [], []
    for i, w in enumerate(wins):
        lp, top = scorer(w)
        lps.append(lp)
        tops.append(top)
        if (i + 1) % 10 == 0 or i + 1 == len(wins):
            print(f"{name}: {i + 1}/{len(wins)} windows, {time.perf_counter() - t0:.0f} s", flush=True)
    return torch.cat(lps), torch.cat(tops), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=20480, help="next-token predictions scored (default: %(default)s)")
    ap.add_argument("--window", type=int, default=512, help="tokens per window, BOS included (default: %(default)s)")
    ap.add_argument("--out", default="quality.json")
    ap.add_argument("--kernel-only", action="store_true",
                    help="run every matmul of the gguf path on the decode kernel (a window is one prefill: by default "
                         "its matmuls dequantize and run sgemm, which are the float32 path's numbers bit for bit)")  # fmt: skip
    ap.add_argument("--no-llama-cpp", dest="llama_cpp", action="store_false", help="leave out llama.cpp")
    args = ap.parse_args()
    if args.kernel_only:
        from aserve.kernels import gguf_linear

        gguf_linear.GEMM_MIN_ROWS = 1 << 30
    from aserve.engine.setup import load_tokenizer

    tok = load_tokenizer(resolve_model_path("gemma-3-270m"))
    ids = tok.encode(corpus_text())
    bos = tok.bos_token_id
    assert bos is not None, "the default model has a BOS token"
    wins = windows(ids, bos, args.window, args.tokens)
    ref_lp, ref_top, ref_s = run("aserve float32", aserve_scorer(False), wins)
    rows: list[dict[str, Any]] = [{"engine": "aserve float32", "ppl": math.exp(-ref_lp.mean().item()),
                                   "top1_agreement": 1.0, "seconds": ref_s}]  # fmt: skip
    makers: list[tuple[str, Callable[[], Scorer | None]]] = [
        ("aserve gguf blocks", lambda: aserve_scorer(True)),
        ("aserve gguf blocks, int8 head", lambda: aserve_scorer(True, head_int8=True)),
        ("aserve gguf, int8 head, bf16 matmuls", lambda: aserve_scorer(True, head_int8=True, gemm_bf16=True)),
    ]
    if args.llama_cpp:
        makers.append(("llama.cpp (llama-cpp-python)", lambda: llama_cpp_scorer(args.window, torch.get_num_threads())))
    for name, make in makers:
        scorer = make()  # one engine in memory at a time
        if scorer is None:
            print(f"{name}: not installed, skipped")
            continue
        lp, top, secs = run(name, scorer, wins)
        rows.append({"engine": name, "ppl": math.exp(-lp.mean().item()),
                     "top1_agreement": (top == ref_top).double().mean().item(), "seconds": secs})  # fmt: skip
    for r in rows[1:]:
        r["ppl_vs_float32"] = r["ppl"] / rows[0]["ppl"] - 1.0
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, torch threads {torch.get_num_threads()}",
        "load_average_after": os.getloadavg(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gguf_matmuls": "decode kernel for every call" if args.kernel_only else "kernel below 32 rows, else sgemm",
        "corpus": f"docstrings of {len(CORPUS_MODULES)} stdlib modules (Python {platform.python_version()})",
        "windows": len(wins),
        "window": args.window,
        "scored_tokens": len(wins) * (args.window - 1),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{result['scored_tokens']} tokens in {len(wins)} windows of {args.window}")
    print(f"{'engine':>30} {'ppl':>9} {'vs f32':>8} {'top-1 = f32':>12} {'s':>7}")
    for r in rows:
        rel = r.get("ppl_vs_float32")
        print(f"{r['engine']:>30} {r['ppl']:9.4f} {'-' if rel is None else f'{rel:+.3%}':>8} "
              f"{r['top1_agreement']:12.4%} {r['seconds']:7.1f}")  # fmt: skip


if __name__ == "__main__":
    main()

"""A decode step's layer GEMMs alone: cuBLAS (``F.linear``, what the model runs) against the
Triton GEMM of ``aserve.kernels.linear`` over launch configurations, at the floor's shapes
(issue 15: which of the Gemma 3 270M shape's ~5 us projections a smaller tiling or split-K
would shorten, before any of it goes into the model).

    python -m aserve.bench.layer_gemms --out layer_gemms.json
    python -m aserve.bench.layer_gemms --shapes gemma3-270m --batches 256

Each GEMM is timed over as many distinct weights as the shape has layers, in turn, captured in a
CUDA graph and replayed (``gpu_workloads.graph_time_us``), so the weights come from HBM as in a
step rather than from L2. A split-K time is the partial products' kernel alone: the sum over the
splits is left to the GEMM's consumer (a norm or activation kernel that reads the [S, M, N]
float32 slices). The output and down projections are also timed with that consumer, the fused
residual add + norm, after them (``with_norm_us``): what a step pays, the partials' extra bytes
included. Prints a table, writes JSON. Meant for a GPU (on a CPU the Triton kernels run in
Triton's interpreter, ``TRITON_INTERPRET=1``: a check that the script runs, not a timing).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import aserve
from aserve.bench.checkpoints import SHAPES
from aserve.bench.gpu_workloads import graph_time_us
from aserve.kernels.fused import add_rmsnorm
from aserve.kernels.linear import LinearLaunch, linear

NORMED = ("o", "down")  # the projections whose output goes to the fused add + norm
TILES = ((64, 32, 128), (64, 64, 64), (64, 64, 128), (64, 128, 64), (128, 64, 64), (128, 128, 64), (32, 64, 128))


def gemms(shape: str) -> dict[str, tuple[int, int]]:
    """A shape's layer projections: name -> (N, K), as ``nn.Linear`` weights [N, K]."""
    s = SHAPES[shape]
    hidden, inter, d = s["hidden_size"], s["intermediate_size"], s["head_dim"]
    h, hkv = s["num_attention_heads"], s["num_key_value_heads"]
    return {"qkv": ((h + 2 * hkv) * d, hidden), "o": (hidden, h * d), "gate_up": (2 * inter, hidden),
            "down": (hidden, inter)}  # fmt: skip


def configs(tiles: tuple[tuple[int, int, int], ...], splits: list[int], stages: list[int]) -> list[LinearLaunch]:
    return [
        LinearLaunch(block_m=bm, block_n=bn, block_k=bk, split_k=s, num_stages=st)
        for (bm, bn, bk), s, st in itertools.product(tiles, splits, stages)
    ]


def time_gemm(
    shape: str, name: str, batch: int, launches: list[LinearLaunch], device: str, dtype: torch.dtype = torch.bfloat16
) -> list[dict[str, Any]]:
    """cuBLAS and each launch on one GEMM of ``shape`` at ``batch`` rows."""
    n, k = gemms(shape)[name]
    layers = int(SHAPES[shape]["num_hidden_layers"])
    gen = torch.Generator(device=device).manual_seed(0)
    ws = [torch.randn(n, k, device=device, dtype=dtype, generator=gen) * k**-0.5 for _ in range(layers)]
    x = torch.randn(batch, k, device=device, dtype=dtype, generator=gen)
    ref = F.linear(x, ws[0]).float()
    base = {"shape": shape, "gemm": name, "batch": batch, "n": n, "k": k, "weight_mb": n * k * 2 / 1e6}

    def rotating(fn: Any) -> Any:
        it = itertools.cycle(ws)
        return lambda: fn(next(it))

    # The output and down projections' consumer, the fused add + norm (Gemma's with its sandwich
    # norm), timed with each GEMM too: what the step pays, partials' extra bytes included.
    gemma = SHAPES[shape]["arch"] == "gemma3"
    res, nw = (
        torch.randn(batch, n, device=device, dtype=x.dtype, generator=gen),
        torch.randn(n, device=device).to(x.dtype),
    )
    xw = nw.flip(0) if gemma else None

    def normed(y: torch.Tensor) -> torch.Tensor:
        return add_rmsnorm(y, res, nw, 1e-6, gemma, xw)[1]

    rows = [{**base, "kernel": "cublas", "us": graph_time_us(rotating(lambda w: F.linear(x, w)), device, reps=layers)}]
    if name in NORMED:
        rows[0]["with_norm_us"] = graph_time_us(rotating(lambda w: normed(F.linear(x, w))), device, reps=layers)
    for launch in launches:
        row: dict[str, Any] = {**base, "kernel": "triton", **launch.__dict__}
        try:
            out = linear(x, ws[0], launch)  # checked against cuBLAS, then the timed calls' output buffer
            got = out.float() if launch.split_k == 1 else out.sum(0)
            row["max_rel_diff"] = float((got - ref).abs().max() / ref.abs().max())
            row["partial_mb"] = 0.0 if launch.split_k == 1 else out.numel() * 4 / 1e6
            row["us"] = graph_time_us(rotating(lambda w, la=launch, o=out: linear(x, w, la, o)), device, reps=layers)
            if name in NORMED:
                row["with_norm_us"] = graph_time_us(
                    rotating(lambda w, la=launch, o=out: normed(linear(x, w, la, o))), device, reps=layers
                )
        except Exception as e:  # out of shared memory or registers: this configuration does not run
            row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="layer_gemms.json")
    ap.add_argument("--shapes", default="gemma3-270m,llama3.2-1b")
    ap.add_argument("--gemms", default="qkv,o,gate_up,down")
    ap.add_argument("--batches", default="64,256,512")
    ap.add_argument("--splits", default="1,2,4")
    ap.add_argument("--stages", default="3")
    ap.add_argument("--tiles", default=",".join("x".join(map(str, t)) for t in TILES), help="BMxBNxBK,...")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    tiles = tuple(tuple(int(v) for v in t.split("x")) for t in args.tiles.split(","))
    launches = configs(tiles, ints(args.splits), ints(args.stages))  # type: ignore[arg-type]
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "aserve": aserve.__version__,
                               "torch": torch.__version__, "device": args.device, "rows": []}  # fmt: skip
    if args.device == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
    for shape, name, batch in itertools.product(args.shapes.split(","), args.gemms.split(","), ints(args.batches)):
        results["rows"] += time_gemm(shape, name, batch, launches, args.device)
        Path(args.out).write_text(json.dumps(results, indent=1))
    table(results["rows"])


def table(rows: list[dict[str, Any]]) -> None:
    """Per GEMM and batch: cuBLAS, the best Triton launch without and with split-K."""
    print(f"{'shape':<12} {'gemm':<8} {'batch':>5} {'N x K':>12} {'cuBLAS us':>9} {'best 1-split':>30}"
          f" {'best split-K':>34} {'+ add/norm: cuBLAS':>18} {'best split-K':>32}")  # fmt: skip
    keys = sorted({(r["shape"], r["gemm"], r["batch"]) for r in rows}, key=str)
    for key in keys:
        mine = [r for r in rows if (r["shape"], r["gemm"], r["batch"]) == key and "us" in r]
        cublas = next(r for r in mine if r["kernel"] == "cublas")

        def best(split: bool, field: str = "us", mine: list[dict[str, Any]] = mine) -> str:
            cand = [r for r in mine if r["kernel"] == "triton" and (r["split_k"] > 1) == split and field in r]
            if not cand:
                return "-"
            r = min(cand, key=lambda r: r[field])
            return (f"{r[field]:.2f} ({r['block_m']}x{r['block_n']}x{r['block_k']}"
                    f"{'/' + str(r['split_k']) if split else ''} st{r['num_stages']})")  # fmt: skip

        nk = f"{cublas['n']}x{cublas['k']}"
        normed = f"{cublas['with_norm_us']:.2f}" if "with_norm_us" in cublas else "-"
        print(f"{key[0]:<12} {key[1]:<8} {key[2]:>5} {nk:>12} {cublas['us']:>9.2f} {best(False):>30} {best(True):>34}"
              f" {normed:>18} {best(True, 'with_norm_us'):>32}")  # fmt: skip


if __name__ == "__main__":
    main()

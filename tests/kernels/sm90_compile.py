"""Compile every Triton kernel of aserve ahead of time for an NVIDIA Hopper GPU (sm_90).

Triton's interpreter (how CI runs the kernels on a CPU) accepts code that the real compiler
rejects: a non-constexpr global, a dot with a block under 16, an unsupported cast. This
script runs the real compiler -- front end, MLIR passes, LLVM, ``ptxas`` -- for the
configurations the engine launches, with no GPU needed. It must run *without*
``TRITON_INTERPRET`` (``tests/kernels/test_sm90_compile.py`` starts it in a clean process):

    python -m tests.kernels.sm90_compile [--arch 90]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

_PTR = {"float32": "*fp32", "bfloat16": "*bf16", "int64": "*i64"}


def _signature(kernel: Any, pointers: dict[str, str], constexprs: dict[str, Any]) -> dict[str, str]:
    """Every parameter: pointers as given, constexprs marked, strides/lengths i32, the rest fp32."""
    sig: dict[str, str] = {}
    for param in kernel.params:
        name = param.name
        if param.is_constexpr:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
        elif name in ("scale", "eps"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"  # strides, lengths, window
    missing = [p.name for p in kernel.params if p.is_constexpr and p.name not in constexprs]
    assert not missing, f"{kernel.fn.__name__}: constexprs {missing} not given"
    return sig


def configurations() -> list[tuple[str, Any, dict[str, str], dict[str, Any]]]:
    from aserve.attention import triton_paged as tp
    from aserve.kernels import bitmask, fused, linear

    out: list[tuple[str, Any, dict[str, str], dict[str, Any]]] = []
    for dtype in ("bfloat16", "float32"):
        act = _PTR[dtype]
        prec = "ieee" if dtype == "float32" else "tf32"
        # (head_dim, query heads per KV head, sliding window): Gemma 3 270M, Llama 3.2 1B, Qwen-like.
        for d, group, window in ((256, 4, True), (256, 4, False), (64, 4, False), (128, 8, False)):
            for splits in (1, 32):
                ptrs = {n: act for n in ("Q", "K", "V")} | {n: "*i64" for n in ("Table", "Rows", "SeqLens")}
                ptrs |= {"MidO": "*fp32", "MidLse": "*fp32", "Out": act, "Count": "*i32"}
                for inline in (False, True) if splits > 1 else (False,):
                    cx = {"GROUP": group, "BLOCK_G": max(16, group), "D": d, "BLOCK_N": 32, "NUM_SPLITS": splits,
                          "HAS_WINDOW": window, "PRECISION": prec, "INLINE_MERGE": inline, "PDL": splits == 1}  # fmt: skip
                    out.append((f"decode d={d} g={group} w={window} s={splits} inline={inline} {dtype}",
                                tp._decode_split_kernel, ptrs, cx))  # fmt: skip
                out.append((f"merge d={d} s={splits} {dtype}", tp._decode_merge_kernel,
                            {"MidO": "*fp32", "MidLse": "*fp32", "Out": act},
                            {"NUM_SPLITS": splits, "D": d, "PDL": splits > 1}))  # fmt: skip
            ptrs = {n: act for n in ("Q", "K", "V", "Out")} | {
                n: "*i64" for n in ("Table", "Rows", "Prefix", "Extend", "QStart", "BlockSeq", "BlockIdx")
            }
            cx = {"GROUP": group, "D": d, "BLOCK_M": 16 if d > 128 else 32, "BLOCK_N": 32, "HAS_WINDOW": window,
                  "PRECISION": prec}  # fmt: skip
            out.append((f"extend d={d} g={group} w={window} {dtype}", tp._extend_kernel, ptrs, cx))
        for gemma in (True, False):
            for dim in (640, 2048):
                out.append((f"rmsnorm gemma={gemma} dim={dim} {dtype}", fused._rmsnorm_kernel,
                            {"X": act, "W": act, "Y": act},
                            {"GEMMA": gemma, "BLOCK": 1024 if dim == 640 else 2048, "PDL": gemma}))  # fmt: skip
                for splits in (1, 4):
                    out.append((f"add_rmsnorm gemma={gemma} dim={dim} splits={splits} {dtype}",
                                fused._add_rmsnorm_kernel,
                                {"X": act if splits == 1 else "*fp32", "R": act, "WX": act, "W": act, "H": act,
                                 "Y": act},
                                {"GEMMA": gemma, "NORM_X": gemma, "SPLITS": splits,
                                 "BLOCK": 1024 if dim == 640 else 2048, "PDL": not gemma}))  # fmt: skip
        for half in (32, 128):
            out.append((f"rotary half={half} {dtype}", fused._rotary_kernel,
                        {"X": act, "Cos": act, "Sin": act, "Y": act}, {"HALF": half}))  # fmt: skip
            out.append((f"cos_sin half={half} {dtype}", fused._cos_sin_kernel,
                        {"Pos": "*i64", "Inv": "*fp32", "Cos": act, "Sin": act},
                        {"HALF": half, "PDL": half == 32}))  # fmt: skip
        for gelu in (True, False):
            out.append((f"gated gelu={gelu} {dtype}", fused._gated_kernel, {"G": act, "U": act, "Y": act},
                        {"GELU": gelu, "BLOCK": 1024, "PDL": gelu}))  # fmt: skip
            for bm in (16, 64):
                out.append((f"gate_up gelu={gelu} bm={bm} {dtype}", fused._gate_up_kernel,
                            {"X": act, "W": act, "Y": act},
                            {"GELU": gelu, "BM": bm, "BN": 64, "BK": 64, "PRECISION": prec, "PDL": gelu}))  # fmt: skip
        for bm, bn, bk in ((64, 32, 128), (128, 128, 64), (32, 64, 128)):
            for y in (act, "*fp32"):  # the product, or split-K's float32 partial products
                out.append((f"linear {bm}x{bn}x{bk} y={y} {dtype}", linear._linear_kernel,
                            {"X": act, "W": act, "Y": y},
                            {"BM": bm, "BN": bn, "BK": bk, "PRECISION": prec, "PDL": y == act}))  # fmt: skip
        # (query heads, KV heads, head_dim / 2, per-head q/k norm): Gemma 3 270M, Llama 3.2 1B.
        for h, hkv, half, norm in ((4, 1, 128, True), (32, 8, 32, False)):
            ptrs = {n: act for n in ("QKV", "QW", "KW", "Cos", "Sin", "Q", "KC", "VC")} | {"Slots": "*i64"}
            out.append((f"qkv_prep h={h} hkv={hkv} half={half} {dtype}", fused._qkv_prep_kernel, ptrs,
                        {"H": h, "HKV": hkv, "HALF": half, "NORM": norm, "GEMMA": norm, "PDL": norm,
                         "HB": fused.qkv_prep_heads(h, hkv, 2 * half)}))  # fmt: skip
    for dtype in ("bfloat16", "float32"):
        for automaton, masked in ((False, True), (True, True), (False, False)):
            ptrs = {"Logits": _PTR[dtype], "Bits": "*i32", "Count": "*i32"}
            ptrs |= {n: "*i64" for n in ("Rows", "Out", "Keys", "FmTokens", "FmRows", "MaskOf", "Start", "States",
                                         "StateRows", "AutoKeys", "AutoAfter")}  # fmt: skip
            out.append((f"argmax automaton={automaton} masked={masked} {dtype}", bitmask._masked_argmax_kernel, ptrs,
                        {"PUBLISH": True, "AUTOMATON": automaton, "MASKED": masked, "WORDS": bitmask._ARGMAX_WORDS,
                         "PDL": not masked}))  # fmt: skip
        out.append((f"bitmask {dtype}", bitmask._apply_bitmask_kernel,
                    {"Logits": _PTR[dtype], "Rows": "*i64", "Bits": "*i32"}, {"WORDS": bitmask._WORDS}))  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--only", default="", help="substring filter on configuration names")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        print("unset TRITON_INTERPRET: the interpreter is what this check goes around", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", args.arch, 32)
    failed = 0
    for name, kernel, ptrs, cx in configurations():
        if args.only not in name:
            continue
        t0 = time.perf_counter()
        try:
            src = ASTSource(fn=kernel, signature=_signature(kernel, ptrs, cx), constexprs=cx)
            compiled = triton.compile(src, target=target)
            regs = compiled.n_regs if hasattr(compiled, "n_regs") else "?"
            print(f"ok   {name:<44} {time.perf_counter() - t0:5.1f}s  shared={compiled.metadata.shared} regs={regs}")
        except Exception as exc:  # report every failure, not only the first
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc)[-2000:]}")
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Session 20: the masked argmax of a constrained greedy step, [B, 262,144] bf16 logits, as it
was (apply_bitmask_ in place, then argmax) and fused (masked_argmax_), with two masks: the
bench schema's (digits, a comma, a bracket: a few tokens allowed) and an open one (all allowed).
CUDA-event timing, median of 50 after 5 warm-ups."""

from __future__ import annotations

import json
import sys

import aserve  # noqa: F401  (before torch)
import torch

from aserve.kernels.bitmask import apply_bitmask_, masked_argmax_


def timeit(fn, n: int = 50) -> float:
    for _ in range(5):
        fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return sorted(ts)[len(ts) // 2]


rows_out = []
V = 262144
for B in (64, 256, 512):
    logits = torch.randn(B, V, device="cuda").to(torch.bfloat16)
    rows = torch.arange(B, device="cuda")
    words = V // 32
    sparse = torch.zeros(B, words, dtype=torch.int32)
    g = torch.Generator().manual_seed(0)
    for r in range(B):  # ~20 allowed tokens a row, scattered
        for t in torch.randint(0, V, (20,), generator=g).tolist():
            sparse[r, t // 32] |= 1 << (t % 32) if t % 32 != 31 else -(2**31)
    open_ = torch.full((B, words), -1, dtype=torch.int32)
    for name, bits in (("sparse", sparse.cuda()), ("open", open_.cuda())):
        graph_tokens = logits.argmax(-1)
        work = logits.clone()

        def before() -> torch.Tensor:
            work.copy_(logits)  # (the copy is timed apart and taken off)
            apply_bitmask_(work, rows, bits)
            return work.argmax(-1)

        def copy_only() -> None:
            work.copy_(logits)

        def fused() -> torch.Tensor:
            out = graph_tokens.clone()
            return masked_argmax_(out, logits, rows, bits)

        assert torch.equal(before(), fused()), (B, name)
        t_copy = timeit(copy_only)
        t_before = timeit(before) - t_copy
        t_fused = timeit(fused)
        row = {"batch": B, "mask": name, "apply_then_argmax_us": t_before, "fused_us": t_fused}
        rows_out.append(row)
        print(f"B={B:4d} {name:6s}  apply+argmax {t_before:8.1f} us   fused {t_fused:8.1f} us", flush=True)
json.dump(rows_out, open(sys.argv[1] if len(sys.argv) > 1 else "kernel_ab.json", "w"), indent=1)

"""Session 21: a constrained greedy step's masked argmax over [B, 262,144] bf16 logits, three
ways: the in-place masks then argmax (``apply_bitmask_`` + ``argmax``), session 20's fused pair
(two Triton launches, from the tree at .gpu/before) and the one-launch kernel (``masked_argmax_``
now, with the FutureMap publish in it). Two masks: ~20 scattered allowed tokens a row, and all
allowed. Each is timed two ways: ``device``, replays of a CUDA graph holding 10 calls (the
device's own time, no launch cost), and ``eager``, 50 calls back to back between two events
(what a step pays with the launches, the host's cost where it exceeds the device's).
Median of 7 measures. Writes JSON to argv[1]."""

from __future__ import annotations

import importlib.util
import json
import sys

import aserve  # noqa: F401  (before torch)
import torch

from aserve.kernels.bitmask import apply_bitmask_, masked_argmax_

spec = importlib.util.spec_from_file_location("before_bitmask", ".gpu/before/aserve/kernels/bitmask.py")
assert spec is not None and spec.loader is not None
before = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before)


def measure(fn, graph_calls: int = 10, eager_calls: int = 50) -> tuple[float, float]:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(graph_calls):
            fn()
    dev, eager = [], []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        dev.append(a.elapsed_time(b) * 1e3 / graph_calls)
        a.record()
        for _ in range(eager_calls):
            fn()
        b.record()
        b.synchronize()
        eager.append(a.elapsed_time(b) * 1e3 / eager_calls)
    return sorted(dev)[3], sorted(eager)[3]


rows_out = []
V = 262144
for B in (16, 64, 256, 512):
    logits = torch.randn(B, V, device="cuda").to(torch.bfloat16)
    rows = torch.arange(B, device="cuda")
    table_rows = torch.randperm(B, device="cuda") + 1
    mailboxes = torch.zeros(B + 1, dtype=torch.int64, device="cuda")
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

        def in_place() -> torch.Tensor:
            apply_bitmask_(work, rows, bits)  # (work keeps its first masking: same traffic)
            tokens = work.argmax(-1)
            mailboxes[table_rows] = tokens
            return tokens

        def pair() -> torch.Tensor:
            out = graph_tokens.clone()
            before.masked_argmax_(out, logits, rows, bits)
            mailboxes[table_rows] = out
            return out

        def one() -> torch.Tensor:
            out = graph_tokens.clone()
            return masked_argmax_(out, logits, rows, bits, (mailboxes, table_rows))

        work.copy_(logits)
        ref = in_place()
        assert torch.equal(ref, pair()) and torch.equal(ref, one()), (B, name)
        assert torch.equal(mailboxes[table_rows], ref), (B, name)
        row = {"batch": B, "mask": name}
        for label, fn in (("in_place", in_place), ("pair", pair), ("one_launch", one)):
            d, e = measure(fn)
            row[f"{label}_device_us"], row[f"{label}_eager_us"] = d, e
        rows_out.append(row)
        print(f"B={B:4d} {name:6s}  device us: in-place {row['in_place_device_us']:7.1f}  pair "
              f"{row['pair_device_us']:7.1f}  one {row['one_launch_device_us']:7.1f}   eager us: in-place "
              f"{row['in_place_eager_us']:7.1f}  pair {row['pair_eager_us']:7.1f}  one {row['one_launch_eager_us']:7.1f}",
              flush=True)  # fmt: skip
json.dump(rows_out, open(sys.argv[1] if len(sys.argv) > 1 else "kernel_ab.json", "w"), indent=1)

"""Session 23: what a split step's sampler launch costs the host, eager against a CUDA graph.

The split step's sampler (a greedy decode step whose rows are all constrained, issue 16) is
launched today as the runner does it (``ModelRunner._masked_argmax`` and ``_sample_cuda``): the
masks' H2D copy from pinned memory on the schedule stream, a wait, an event, the graph's
argmax cloned, the masked argmax (a Triton launch, publishing into a FutureMap), an event, a
wait, the tokens' D2H copy on the copy stream, an event. Here the same work is measured:

1. ``eager``: the sequence above, host microseconds per launch (the device drained between
   launches, so only the host's calls are timed), and its device time;
2. ``graph``: the masks' H2D copy, the masked argmax over every row of the bucket and the
   tokens' D2H copy into pinned memory, captured as one CUDA graph on static buffers; host
   microseconds of the replay and one event; the tokens against ``eager``'s;
3. ``zero copy``: one masked argmax reading its masks from pinned host memory, no copy;
   device time (the kernel pulls 32 KiB a row over PCIe);
4. from session 22's flag_wait.py: how soon a one-program Triton kernel spinning on a pinned
   flag is released after the host's store.

Prints JSON; --out writes it."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import aserve  # noqa: F401  (before torch)
import torch

from aserve.kernels.bitmask import masked_argmax_

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "s22" / "2026-12-06"))
from flag_wait import HostPtr, release_latency  # noqa: E402

VOCAB = 262144
WORDS = VOCAB // 32


def host_us(fn, n: int = 50) -> float:  # type: ignore[no-untyped-def]
    res = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        res.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(res) * 1e6


def device_us(fn, n: int = 20) -> float:  # type: ignore[no-untyped-def]
    res = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        res.append(a.elapsed_time(b) * 1e3 / n)
    return statistics.median(res)


def one_size(b: int) -> dict[str, object]:
    dev = torch.device("cuda")
    sched, fwd_s, copy_s = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    logits = torch.randn(b, VOCAB, device=dev, dtype=torch.bfloat16)
    argmax = logits.argmax(dim=-1)
    gen = torch.Generator().manual_seed(b)
    masks_host = torch.randint(-(2**31), 2**31 - 1, (b, WORDS), dtype=torch.int32, generator=gen).pin_memory()
    rows = torch.arange(b, device=dev)
    fm_tokens = torch.zeros(4096, dtype=torch.int64, device=dev)
    fm_rows = torch.randperm(4096, device=dev)[:b].contiguous()
    out_host = torch.empty(b, dtype=torch.int64, pin_memory=True)

    def eager() -> None:
        with torch.cuda.stream(sched):
            bits = masks_host.to(dev, non_blocking=True)
        fwd_s.wait_stream(sched)
        with torch.cuda.stream(fwd_s):
            torch.cuda.Event(enable_timing=True).record(fwd_s)
            tokens = argmax.clone()
            masked_argmax_(tokens, logits, rows, bits, (fm_tokens, fm_rows))
            torch.cuda.Event(enable_timing=True).record(fwd_s)
        copy_s.wait_stream(fwd_s)
        with torch.cuda.stream(copy_s):
            out_host.copy_(tokens, non_blocking=True)
            torch.cuda.Event(enable_timing=True).record(copy_s)

    eager()
    torch.cuda.synchronize()
    want = out_host.clone()
    res: dict[str, object] = {"rows": b, "eager_host_us": host_us(eager), "eager_device_us": device_us(eager)}

    # The graph: static device masks and tokens; the pinned masks and output are the graph's too.
    bits_dev = torch.empty(b, WORDS, dtype=torch.int32, device=dev)
    tokens_dev = torch.empty(b, dtype=torch.int64, device=dev)
    g_out = torch.empty(b, dtype=torch.int64, pin_memory=True)

    def body() -> None:
        bits_dev.copy_(masks_host, non_blocking=True)
        masked_argmax_(tokens_dev, logits, rows, bits_dev, (fm_tokens, fm_rows))
        g_out.copy_(tokens_dev, non_blocking=True)

    cap = torch.cuda.Stream()
    try:
        with torch.cuda.stream(cap):
            body()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=cap):
            body()
        torch.cuda.synchronize()
        g_out.zero_()

        def replay() -> None:
            with torch.cuda.stream(fwd_s):
                graph.replay()
                torch.cuda.Event(enable_timing=True).record(fwd_s)

        replay()
        torch.cuda.synchronize()
        res["graph_same_tokens"] = bool(torch.equal(g_out, want))
        res["graph_host_us"] = host_us(replay)
        res["graph_device_us"] = device_us(replay)
    except Exception as exc:  # noqa: BLE001
        res["graph_error"] = repr(exc)

    # Zero copy: the kernel reads the pinned masks.
    class HostBits(HostPtr):
        def stride(self, i: int) -> int:
            return self.t.stride(i)

        @property
        def shape(self) -> torch.Size:
            return self.t.shape

    hb = HostBits(masks_host)
    zc_tokens = torch.empty(b, dtype=torch.int64, device=dev)
    try:
        masked_argmax_(zc_tokens, logits, rows, hb, (fm_tokens, fm_rows))  # type: ignore[arg-type]
        torch.cuda.synchronize()
        res["zero_copy_same_tokens"] = bool(torch.equal(zc_tokens.cpu(), want))
        res["zero_copy_device_us"] = device_us(lambda: masked_argmax_(zc_tokens, logits, rows, hb, (fm_tokens, fm_rows)))  # type: ignore[arg-type]
        res["kernel_alone_device_us"] = device_us(lambda: masked_argmax_(tokens_dev, logits, rows, bits_dev, (fm_tokens, fm_rows)))
        res["kernel_alone_host_us"] = host_us(lambda: masked_argmax_(tokens_dev, logits, rows, bits_dev, (fm_tokens, fm_rows)))
    except Exception as exc:  # noqa: BLE001
        res["zero_copy_error"] = repr(exc)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sampler_graph.json")
    args = ap.parse_args()
    res: dict[str, object] = {"gpu": torch.cuda.get_device_name()}
    for b in (64, 256):
        res[f"b{b}"] = one_size(b)
        print(json.dumps(res[f"b{b}"]), flush=True)
    try:
        res["release"] = release_latency(50, 0.002)
    except Exception as exc:  # noqa: BLE001
        res["release_error"] = repr(exc)
    print(json.dumps(res, indent=1))
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

"""A floor for a persistent decode batch's host step: the list operations alone (slots from the
page tables, packing, advancing positions, appending each token to its output and its cell's
list, the stop and length checks), B requests, pure Python, no engine objects.

    python docs/results/h100-s15/2026-12-05/columnar_floor.py
"""

import random
import statistics
import struct
import time


def run(batch: int, steps: int = 400, ps: int = 16) -> float:
    rng = random.Random(0)
    rows = list(range(batch))
    gens = [1] * batch
    pos = [128 + i % 16 for i in range(batch)]
    pages = [[rng.randrange(100000) for _ in range(128)] for _ in range(batch)]
    outputs: list[list[int]] = [[] for _ in range(batch)]
    cells: list[list[int]] = [[] for _ in range(batch)]
    remaining = [10**6] * batch
    stop = frozenset({1})
    times, crossing, ended = [], 0, 0
    for _ in range(steps):
        tokens = [rng.randrange(2, 60000) for _ in range(batch)]
        t0 = time.perf_counter()
        slots = [pg[p // ps] * ps + p % ps for pg, p in zip(pages, pos)]
        crossing += len([i for i, p in enumerate(pos) if p % ps == ps - 1])  # a page to allocate next
        flat = rows + gens + pos + slots
        buf = bytearray(8 * len(flat))
        struct.pack_into(f"{len(flat)}q", buf, 0, *flat)
        pos = [p + 1 for p in pos]
        for out, cell, token in zip(outputs, cells, tokens):
            out.append(token)
            cell.append(token)
        remaining = [r - 1 for r in remaining]
        ended += len([i for i, t in enumerate(tokens) if t in stop]) + len(
            [i for i, r in enumerate(remaining) if r == 0]
        )
        times.append(time.perf_counter() - t0)
        for cell in cells:
            cell.clear()
    assert crossing > 0
    return statistics.median(times) * 1e6


if __name__ == "__main__":
    for b in (64, 256, 512):
        us = run(b)
        print(f"batch {b}: {us:.0f} us a step, {us / b:.2f} us a request")

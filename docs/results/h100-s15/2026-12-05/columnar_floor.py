"""A floor for a persistent decode batch's host step: the list operations alone (slots from
page tables, packing, advancing positions, appending each token to its output and its cell's
list, the stop and length checks), B requests, pure Python, no engine objects."""
import random, struct, time, statistics
def run(B, steps=400, ps=16):
    rng = random.Random(0)
    rows = list(range(B)); pos = [128 + i % 16 for i in range(B)]
    pages = [[rng.randrange(100000) for _ in range(128)] for _ in range(B)]
    outputs = [[] for _ in range(B)]; cells = [[] for _ in range(B)]; gens = [1] * B
    remaining = [10**6] * B; stop = frozenset({1})
    times = []
    for s in range(steps):
        tokens = [rng.randrange(2, 60000) for _ in range(B)]
        t0 = time.perf_counter()
        slots = [pg[p // ps] * ps + p % ps for pg, p in zip(pages, pos)]
        cross = [i for i, p in enumerate(pos) if p % ps == ps - 1]
        flat = rows + gens + pos + slots
        buf = bytearray(8 * len(flat)); struct.pack_into(f"{len(flat)}q", buf, 0, *flat)
        pos = [p + 1 for p in pos]
        for out, c, t in zip(outputs, cells, tokens):
            out.append(t); c.append(t)
        remaining = [r - 1 for r in remaining]
        ended = [i for i, t in enumerate(tokens) if t in stop] + [i for i, r in enumerate(remaining) if r == 0]
        times.append(time.perf_counter() - t0)
        for c in cells: c.clear()
    return statistics.median(times) * 1e6
for B in (64, 256, 512):
    us = run(B); print(f"batch {B}: {us:.0f} us a step, {us / B:.2f} us a request")

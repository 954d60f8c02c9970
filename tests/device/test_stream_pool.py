"""The pool of closed runners' stream sets (``aserve/device/streams.py``): a set in use is never
handed out twice, a given-back set is the next one taken on its device, and one never given
back (a stall) is never reused. On CUDA the sets are streams (tests/gpu/test_release_cuda.py
checks what reusing them saves); the bookkeeping is the same for any object."""

from __future__ import annotations

import itertools
import threading

from hypothesis import given
from hypothesis import strategies as st

from aserve.device.streams import StreamPool


@given(ops=st.lists(st.tuples(st.sampled_from(["take", "close", "stall"]), st.integers(0, 1)), max_size=60))
def test_sets_in_use_are_never_shared_and_closed_ones_are_reused(ops: list[tuple[str, int]]) -> None:
    pool: StreamPool[tuple[int, int]] = StreamPool()
    counter = itertools.count()
    in_use: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    closed: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    dropped: set[tuple[int, int]] = set()
    for op, device in ops:
        if op == "take":
            got = pool.take(device, lambda d=device: (d, next(counter)))
            assert got[0] == device, "a set is only ever handed out on its own device"
            assert all(got not in sets for sets in in_use.values()), "a set in use was handed out again"
            assert got not in dropped, "a stalled runner's set came back"
            if closed[device]:
                assert got in closed[device], "a new set while a closed one was idle"
                closed[device].remove(got)
            in_use[device].append(got)
        elif in_use[device]:
            streams = in_use[device].pop(0)
            if op == "close":
                pool.give_back(device, streams)
                closed[device].append(streams)
            else:  # a stall: the set is dropped, and must never come back
                dropped.add(streams)
        assert pool.idle(0) == len(closed[0]) and pool.idle(1) == len(closed[1])


def test_threads_taking_and_giving_back_never_share_a_set() -> None:
    pool: StreamPool[int] = StreamPool()
    counter = itertools.count()
    lock = threading.Lock()
    holders: set[int] = set()
    errors: list[str] = []

    def worker() -> None:
        for _ in range(2000):
            s = pool.take(0, lambda: next(counter))
            with lock:
                if s in holders:
                    errors.append(f"set {s} handed out twice")
                holders.add(s)
            with lock:
                holders.discard(s)
            pool.give_back(0, s)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert pool.idle(0) <= 4  # at most one set a thread was ever needed at once

"""The core's per-step message to a front end: with a stream's next tokens in columns, every
choice's tokens, their order, each stream's interval and each end arrive as they do with every
choice as an item (the reference form), through a real encode and decode."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from aserve.engine.cell import OutputCell
from aserve.ipc import messages as m
from aserve.ipc.client import EngineClient
from aserve.ipc.core import collect_outputs
from aserve.ipc.delivery import deliver, deliver_columns
from aserve.sampling_params import SamplingParams
from aserve.scheduler.req import Req
from aserve.sync import Signal


def _live(intervals: list[int], n: int) -> dict[str, dict[int, Req]]:
    signal = Signal()
    live: dict[str, dict[int, Req]] = {}
    for i, every in enumerate(intervals):
        params = SamplingParams(max_tokens=64, n=n)
        for index in range(n):
            req = Req(rid=f"r{i}", index=index, prompt_ids=[1, 2], params=params, max_new_tokens=64, seed=0,
                      stop_ids=frozenset())  # fmt: skip
            req.cached_prompt_tokens = 16 * i
            req.cell = OutputCell(signal, wake_every=every)
            live.setdefault(req.rid, {})[index] = req
    return live


def _run(
    intervals: list[int], n: int, seed: int, columns: bool, finish_p: float = 0.05
) -> tuple[dict[tuple[str, int], list[object]], int]:
    """Steps of random pushes and ends, one message a step; what each choice's front end sees,
    in order: token ids, ``("end", reason)``, and the cached count with each token."""
    rng = random.Random(seed)
    live = _live(intervals, n)
    reqs = [req for choices in live.values() for req in choices.values()]
    seen: dict[tuple[str, int], list[object]] = {}
    column_entries = 0
    for step in range(40):
        for req in reqs:
            cell = req.cell
            assert cell is not None
            if cell.finished or rng.random() < 0.2:
                continue
            cell.push(100 * step + req.index, None)
            if rng.random() < finish_p:
                cell.finish("stop", None)
        msg = collect_outputs(live, columns)
        if msg is None:
            continue
        got = m.decode_to_front_end(m.encode(msg))
        assert isinstance(got, m.Outputs)
        at = 0
        for rid, index, count, cached in zip(got.rids, got.indexes, got.counts, got.cached, strict=True):
            seen.setdefault((rid, index), []).extend((t, cached) for t in got.token_ids[at : at + count])
            at += count
            column_entries += 1
        assert at == len(got.token_ids)
        for item in got.items:
            out = seen.setdefault((item.rid, item.index), [])
            out.extend((t, item.cached_tokens) for t in item.token_ids)
            if item.finish_reason is not None:
                out.append(("end", item.finish_reason))
    return seen, column_entries


@settings(max_examples=40, deadline=None)
@given(intervals=st.lists(st.sampled_from([1, 1, 2, 3, 0]), min_size=1, max_size=6), n=st.integers(1, 2),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_columns_deliver_what_items_deliver(intervals: list[int], n: int, seed: int) -> None:
    as_items, none = _run(intervals, n, seed, columns=False)
    as_columns, _ = _run(intervals, n, seed, columns=True)
    assert none == 0
    assert as_columns == as_items


def test_streams_past_their_first_tokens_go_in_columns() -> None:
    as_items, _ = _run([1, 2, 3, 0], 2, seed=5, columns=False, finish_p=0.0)
    as_columns, used = _run([1, 2, 3, 0], 2, seed=5, columns=True, finish_p=0.0)
    assert as_columns == as_items
    assert used > 40, used  # the interval-1 and -2 streams' steady steps, at least


def _front_end_state(intervals: list[int], n: int, seed: int, columns: bool) -> list[tuple[object, ...]]:
    """The same steps delivered into a front end's own requests and cells by ``EngineClient``
    (``delivery.deliver_columns`` and ``deliver`` on its live requests, as its receive loop
    calls them), one request
    aborted there halfway: what its consumers would read."""
    rng = random.Random(seed)
    core = _live(intervals, n)
    client = EngineClient("ipc://unused")  # not started: only its delivery is driven here
    front: dict[str, list[Req]] = {}
    for rid, choices in core.items():
        for index, creq in choices.items():
            req = Req(rid=rid, index=index, prompt_ids=[1, 2], params=creq.params, max_new_tokens=64, seed=0,
                      stop_ids=frozenset())  # fmt: skip
            req.cell = OutputCell(Signal(), wake_every=1)
            front.setdefault(rid, []).append(req)
    client.live = dict(front)
    for step in range(40):
        for creq in (r for choices in core.values() for r in choices.values()):
            cell = creq.cell
            assert cell is not None
            if cell.finished or rng.random() < 0.2:
                continue
            cell.push(100 * step + creq.index, None)
            if rng.random() < 0.05:
                cell.text_limit = 3
                cell.finish("stop", "x")
        if step == 20:
            client.live.pop("r0", None)  # aborted in the front end: later outputs are dropped
        msg = collect_outputs(core, columns)
        if msg is None:
            continue
        got = m.decode_to_front_end(m.encode(msg))
        assert isinstance(got, m.Outputs)
        if got.rids:
            deliver_columns(client.live, got)
        deliver(client.live, got.items, client._core_failed)
    return [
        (r.rid, r.index, list(r.output_ids), r.first_token_time is not None, r.finish_reason, r.cached_prompt_tokens,
         None if r.cell is None else (r.cell.text_limit, r.cell.pushed, r.cell.finished), r.rid in client.live)
        for reqs in front.values() for r in reqs
    ]  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(intervals=st.lists(st.sampled_from([1, 1, 2, 3, 0]), min_size=1, max_size=5), n=st.integers(1, 2),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_a_front_end_ends_in_the_same_state_with_columns(intervals: list[int], n: int, seed: int) -> None:
    assert _front_end_state(intervals, n, seed, columns=True) == _front_end_state(intervals, n, seed, columns=False)

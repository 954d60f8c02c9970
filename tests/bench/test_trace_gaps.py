"""The trace analyzer on a hand-built trace (times in microseconds, as Chrome traces are)."""

from __future__ import annotations

from aserve.bench.trace_gaps import analyze, report


def _x(name: str, ts: float, dur: float, **args: int) -> dict[str, object]:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "args": args}


def test_gaps_are_split_into_runs_and_charged_to_host_spans() -> None:
    events = [
        _x("step 0", 0, 100, seqs=4, tokens=40),
        _x("step 1", 150, 100, seqs=4, tokens=4),  # 50 us idle: the commit covers 30 of it
        _x("commit", 120, 30, step=0),
        _x("step 2", 260, 100, seqs=4, tokens=4),  # 10 us: under the 20 us threshold
        # 2 s later: a second run (the client paused)
        _x("step 3", 2_000_360, 100, seqs=2, tokens=2),
        _x("step 4", 2_001_460, 100, seqs=3, tokens=9),  # 1 ms idle: plan 200 + launch 300 inside
        _x("plan", 2_000_600, 200, step=4),
        _x("launch", 2_000_800, 300, step=4),
        _x("launch", 1_999_000, 50, step=3),  # before the gap: not charged
        {"ph": "M", "name": "thread_name"},
    ]
    first, second = analyze(events)
    assert (first.steps, first.busy_us, first.span_us, first.idle_us) == (3, 300, 360, 50)
    assert first.host_in_gaps() == {"commit": 30, "no host span": 20}
    assert (second.steps, second.idle_us) == (2, 1000)
    assert second.host_in_gaps() == {"plan": 200, "launch": 300, "no host span": 500}
    (gap,) = second.gaps
    assert (gap.before_step, gap.seqs, gap.tokens, gap.at_ms) == (4, (2, 3), (2, 9), 0.1)
    text = report([first, second])
    assert "run 1: 2 steps" in text and "1.00 ms before step 4" in text

"""The step stats' median gaps, kept as the steps come, against ``statistics.median`` of the
same values (the reference the medians used to be computed with)."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from aserve.stats import StepRecord, StepStats, WindowMedian

# Gaps as the recorder gives them: microseconds apart, with repeats (equal values must leave
# the window one at a time).
_gaps = st.lists(st.sampled_from([0.0, 1.2e-6, 1.3e-6, 5e-5, 4e-4, 2e-3]) | st.floats(0, 0.01), max_size=300)


@given(values=_gaps, window=st.integers(1, 40))
def test_window_median_is_the_median_of_the_latest_values(values: list[float], window: int) -> None:
    med = WindowMedian(window)
    for i, v in enumerate(values):
        med.add(v)
        assert med.value() == statistics.median(values[max(0, i + 1 - window) : i + 1])
    if not values:
        assert med.value() is None


def _record(i: int, gap: float | None, decode: bool) -> StepRecord:
    return StepRecord(index=i, num_seqs=4, num_tokens=4 if decode else 40, num_decodes=4 if decode else 3,
                      depth_in_use=2, device_busy_s=1e-3, device_gap_s=gap, plan_s=0.0, launch_s=0.0,
                      commit_s=0.0)  # fmt: skip


@given(steps=st.lists(st.tuples(st.none() | st.floats(0, 0.01), st.booleans()), max_size=200))
def test_step_stats_medians_over_the_records(steps: list[tuple[float | None, bool]]) -> None:
    stats = StepStats()
    for i, (gap, decode) in enumerate(steps):
        stats.add(_record(i, gap, decode))
    gaps = [g for g, _ in steps if g is not None]
    decode_gaps = [g for g, decode in steps if g is not None and decode]
    assert stats.median_gap() == (statistics.median(gaps) if gaps else None)
    assert stats.median_gap(decode_only=True) == (statistics.median(decode_gaps) if decode_gaps else None)
    stats.reset()
    assert stats.median_gap() is None and stats.median_gap(decode_only=True) is None

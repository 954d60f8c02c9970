"""The host benchmark's scheduler loop plans every request every step (or it raises)."""

from __future__ import annotations

from aserve.bench.host_bench import bench_schedule


def test_schedule_bench_plans_the_whole_batch_each_step() -> None:
    out = bench_schedule(batch=8, steps=40)  # crosses page boundaries (page size 16)
    assert out["batch"] == 8 and out["steps"] == 40
    assert 0 < out["median_us"] <= out["p90_us"]

"""The scale-out simulator against numbers worked out by hand."""

from __future__ import annotations

import random

from loadgen.simulate import CostModel, SyntheticVocab, simulate
from loadgen.workloads import WorkItem, shared_prefix_workload

COST = CostModel(step_s=0.001, prefill_token_s=1e-5, decode_seq_s=1e-5, kv_tokens=65536, page=16)


def _spaced(n: int) -> list[float]:
    return [10.0 * k for k in range(n)]  # far apart: every request runs alone


def test_one_replica_hits_every_repeated_prefix_and_times_the_cost_model() -> None:
    # 3 groups x 4 requests, 64-token prefixes (4 pages) + 16-token questions, one at a time:
    # each group's first request misses, the other three hit 64 of 80 tokens.
    items = shared_prefix_workload(SyntheticVocab(), 3, 4, 64, 16, 8, seed=1)
    res = simulate(items, _spaced(len(items)), 1, "prefix", COST)
    assert res.hit_rate == (3 * 3 * 64) / (12 * 80)
    assert res.output_tokens == 12 * 8
    # The last request alone: a prefill step of 16 computed tokens, then 7 decode steps.
    last_prefill = COST.step_s + 16 * COST.prefill_token_s
    assert abs(res.makespan_s - (10.0 * 11 + last_prefill + 7 * (COST.step_s + COST.decode_seq_s))) < 1e-9


def test_prefix_routing_keeps_the_hit_rate_that_round_robin_loses() -> None:
    items = shared_prefix_workload(SyntheticVocab(), 8, 8, 256, 32, 4, seed=3)
    arrivals = _spaced(len(items))
    single = simulate(items, arrivals, 1, "prefix", COST).hit_rate
    prefix = simulate(items, arrivals, 4, "prefix", COST)
    rr = simulate(items, arrivals, 4, "round-robin", COST)
    assert prefix.hit_rate == single  # each group stays on one replica
    assert rr.hit_rate < single  # each group pays its prefix on up to 4 replicas
    assert sorted(prefix.per_replica_requests) == [16, 16, 16, 16]  # 2 groups each


def test_a_small_pool_evicts_and_every_request_still_finishes() -> None:
    rng = random.Random(0)
    items = [WorkItem([rng.randrange(300, 5000) for _ in range(200)], None, 50) for _ in range(40)]
    small = CostModel(kv_tokens=1024, page=16)
    res = simulate(items, [0.0] * len(items), 2, "least-loaded", small)
    assert res.requests == 40 and res.output_tokens == 40 * 50
    assert res.hit_rate == 0.0  # no shared prefixes


def test_simulate_command_replays_a_trace_over_replica_counts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from loadgen.cli import main

    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 0.5 * k, "input_length": 64 + 16 * (k % 3), "output_length": 8} for k in range(30)]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "sim.json"
    assert main(["simulate", "--workload", "trace", "--dataset", str(trace), "--replicas", "1,2",
                 "--out", str(out)]) == 0  # fmt: skip
    doc = json.loads(out.read_text())
    cells = {(r["replicas"], r["policy"]): r for r in doc["results"]}
    assert set(cells) == {(n, p) for n in (1, 2) for p in ("prefix", "round-robin", "least-loaded")}
    assert all(r["requests"] == 30 and r["output_tokens"] == 30 * 8 for r in cells.values())
    assert sum(cells[(2, "round-robin")]["per_replica_requests"]) == 30

"""The metric formulas on hand-made records, and the pieces around them."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from loadgen.arrivals import arrival_times
from loadgen.compare import compare_groups, flatten
from loadgen.honesty import client_view
from loadgen.metrics import SLO, bucket_rate, in_flight_series, summarize, time_weighted_mean
from loadgen.records import RequestRecord
from loadgen.server_view import delta, parse_prometheus
from loadgen.stats import bootstrap_ratio_ci, describe
from loadgen.workloads import (
    fingerprint,
    length_range,
    random_workload,
    shared_prefix_workload,
    sharegpt_workload,
    trace_workload,
)


def rec(i: int, send: float, chunks: Sequence[tuple[float, int]], done: float, **kw: object) -> RequestRecord:
    r = RequestRecord(i, prompt_tokens=10, max_tokens=sum(n for _, n in chunks), scheduled_s=send, send_s=send)
    r.chunk_s = [t for t, _ in chunks]
    r.chunk_tokens = [n for _, n in chunks]
    r.done_s = done
    r.finished = True
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_per_request_formulas() -> None:
    r = rec(0, 1.0, [(1.5, 1), (1.7, 3), (2.0, 2)], 2.1, usage_completion_tokens=6)
    assert r.ttft == pytest.approx(0.5)
    assert r.e2e == pytest.approx(1.1)
    assert r.tpot == pytest.approx((1.1 - 0.5) / 5)  # first token excluded
    assert r.itls == pytest.approx([0.2, 0.3])
    one = rec(1, 0.0, [(0.3, 1)], 0.3)
    assert one.tpot is None and one.itls == []


def test_usage_wins_over_counting() -> None:
    r = rec(0, 0.0, [(0.1, 1), (0.2, 1)], 0.3, usage_completion_tokens=3)
    assert r.output_tokens == 3 and r.counted_tokens == 2
    s = summarize([r], SLO())
    assert s["token_check"]["usage_vs_counted_mismatch"] == [0]


def test_summary_throughput_and_goodput() -> None:
    a = rec(0, 0.0, [(0.5, 1), (1.0, 1)], 1.0)
    b = rec(1, 1.0, [(1.2, 2), (1.6, 2)], 2.0)
    c = rec(2, 1.5, [], 1.6)
    c.fail("HTTPStatus", "boom", 1.6, status=500)
    s = summarize([a, b, c], SLO(ttft=0.4), last_send_s=1.5)
    assert s["duration_s"] == pytest.approx(2.0)
    assert s["tokens"] == {"input": 20, "output": 6}
    assert s["throughput"]["output_tok_per_s"] == pytest.approx(3.0)
    assert s["throughput"]["total_tok_per_s"] == pytest.approx(13.0)
    assert s["throughput"]["requests_per_s"] == pytest.approx(1.0)
    # 1-second buckets: [0,1) holds 1 token, [1,2] holds 5 (the chunk at exactly 1.0 and the rest)
    assert s["series"]["output_tok_per_s_1s"] == [1.0, 5.0]
    assert s["throughput"]["peak_output_tok_per_s"] == 5.0
    assert s["goodput"]["fraction"] == pytest.approx(1 / 3)  # a fails the TTFT SLO, c failed
    assert s["goodput"]["requests_per_s"] == pytest.approx(0.5)
    assert s["failures"] == {
        "by_type": {"HTTPStatus": 1},
        "by_status": {"500": 1},
        "first_messages": {"HTTPStatus:500": "boom"},
    }
    assert s["latency_s"]["itl"]["count"] == 2
    assert s["tokens_per_chunk"]["mean"] == pytest.approx(1.5)
    assert s["steady_state"]["output_tok_per_s"] == pytest.approx(4 / 1.5)  # chunks at 0.5, 1.0, 1.2


def test_slo_parse_and_tpot_of_single_token() -> None:
    slo = SLO.parse("ttft=500ms,tpot=0.05,e2e=2s")
    assert (slo.ttft, slo.tpot, slo.e2e) == (0.5, 0.05, 2.0)
    assert slo.met(rec(0, 0.0, [(0.1, 1)], 0.1))
    with pytest.raises(ValueError):
        SLO.parse("latency=1")


def test_in_flight_and_buckets() -> None:
    a, b = rec(0, 0.0, [(0.5, 1)], 2.0), rec(1, 1.0, [(1.5, 1)], 3.0)
    times, levels = in_flight_series([a, b])
    assert times == [0.0, 1.0, 2.0, 3.0] and levels == [1, 2, 1, 0]
    assert time_weighted_mean(times, levels, 3.0) == pytest.approx((1 + 2 + 1) / 3)
    assert bucket_rate([0.1, 0.2, 2.5], [1, 2, 3], 0.0, 3.0) == [3.0, 0.0, 3.0]


def test_describe_percentiles() -> None:
    d = describe([float(x) for x in range(1, 101)])
    assert d["mean"] == pytest.approx(50.5) and d["p50"] == pytest.approx(50.5)
    assert d["p99"] == pytest.approx(np.percentile(range(1, 101), 99))
    assert describe([])["p99"] is None


def test_bootstrap_ratio() -> None:
    ratio, lo, hi = bootstrap_ratio_ci([10.0, 11.0, 9.0, 10.0], [20.0, 22.0, 18.0, 20.0])
    assert ratio == pytest.approx(2.0)
    assert lo is not None and hi is not None and lo <= 2.0 <= hi
    assert bootstrap_ratio_ci([1.0], [2.0]) == (2.0, None, None)


def test_compare_rows() -> None:
    a = [{"throughput": {"output_tok_per_s": v}, "run": {"label": "x"}} for v in (10.0, 12.0)]
    b = [{"throughput": {"output_tok_per_s": v}, "run": {"label": "y"}} for v in (20.0, 24.0)]
    res = compare_groups([a, b])
    (row,) = res["rows"]
    assert row["metric"] == "throughput.output_tok_per_s"
    assert row["ratios"][0]["ratio"] == pytest.approx(2.0)
    assert flatten({"series": {"x": 1}, "a": {"b": 2, "c": None}}) == {"a.b": 2.0}


def test_send_lag_and_client_view() -> None:
    r = rec(0, 1.03, [(1.5, 1)], 1.6)
    r.scheduled_s, r.ready_s = 1.0, 1.01
    assert r.send_lag == pytest.approx(0.02)
    view = client_view([r], [(0.0, 0.001), (0.1, 0.5)])
    assert view["client_bottleneck"] is True


def test_prometheus_and_delta() -> None:
    text = "# HELP x\naserve_device_busy_seconds_total 2.0\naserve_device_gap_seconds_total 0.5\naserve_engine_steps_total 10\n"
    before = parse_prometheus(text)
    after = {"device_busy_s": 4.0, "device_gap_s": 1.0, "engine_steps": 20.0}
    d = delta(before, after)
    assert d is not None
    assert d["device_busy_s"] == 2.0 and d["device_gap_fraction"] == pytest.approx(0.5 / 2.5)
    assert d["mean_gap_per_step_ms"] == pytest.approx(50.0)


def test_arrivals() -> None:
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]
    assert arrival_times(3, 2.0, process="constant") == [0.0, 0.5, 1.0]
    p = arrival_times(4000, 10.0, seed=1)
    assert p == arrival_times(4000, 10.0, seed=1)  # seeded: identical schedules
    assert np.mean(np.diff(p)) == pytest.approx(0.1, rel=0.05)
    g = np.diff(arrival_times(4000, 10.0, burstiness=0.25, seed=1, process="gamma"))
    assert g.mean() == pytest.approx(0.1, rel=0.1) and g.std() > 1.5 * 0.1  # burstier than Poisson


class ToyTokenizer:
    bos_token_id = 2
    vocab_size = 5000

    def is_special(self, token_id: int) -> bool:
        return token_id < 10

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return ([2] if add_special_tokens else []) + [100 + len(w) for w in text.split()]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join("w" * (i - 100) for i in ids)


def test_workloads(tmp_path: Path) -> None:
    tok = ToyTokenizer()
    assert length_range(100, 0.25) == (75, 125)
    items = random_workload(tok, 20, 16, 4, 0.25, seed=3)
    assert all(12 <= it.prompt_len <= 20 and 3 <= it.max_tokens <= 5 for it in items)
    assert all(it.prompt_ids and it.prompt_ids[0] == 2 for it in items)
    assert fingerprint(items) == fingerprint(random_workload(tok, 20, 16, 4, 0.25, seed=3))
    assert fingerprint(items) != fingerprint(random_workload(tok, 20, 16, 4, 0.25, seed=4))
    sp = shared_prefix_workload(tok, groups=2, per_group=3, system_len=8, question_len=4, output_len=2, seed=0)
    assert len(sp) == 6 and len({tuple(it.prompt_ids[:8]) for it in sp if it.prompt_ids}) == 2
    assert all(it.prompt_len == 12 for it in sp)
    conv = [{"conversations": [{"from": "human", "value": "a bb ccc"}, {"from": "gpt", "value": "x y"}]}] * 3
    (tmp_path / "sg.json").write_text(json.dumps(conv))
    sg = sharegpt_workload(tok, tmp_path / "sg.json", 2, seed=0)
    assert len(sg) == 2 and sg[0].prompt_len == 4 and sg[0].max_tokens == 2
    (tmp_path / "trace.jsonl").write_text(
        "\n".join(json.dumps({"timestamp": 10 + t, "input_length": 6, "output_length": 3}) for t in (0.5, 0.0, 1.5))
    )
    tr = trace_workload(tok, tmp_path / "trace.jsonl", seed=0)
    assert [it.timestamp for it in tr] == [0.0, 0.5, 1.5] and all(it.prompt_len == 6 for it in tr)


def test_counts_add_up_peak_and_a_burst_without_a_steady_state() -> None:
    """sent = completed + failed + unfinished, with requests never sent counted apart; the peak
    is over any one-second window (a burst straddling two fixed buckets is not halved), and a
    burst (everything sent at once) reports no steady state."""
    a = rec(0, 0.0, [(0.5, 10)], 0.5)
    b = rec(1, 0.0, [(1.02, 10)], 1.04)
    stuck = rec(2, 0.0, [], 1.04)
    stuck.finished = False
    never = RequestRecord(3, prompt_tokens=10, max_tokens=4, scheduled_s=None)  # waited for a slot; never sent
    s = summarize([a, b, stuck, never], SLO(), last_send_s=0.0)
    req = s["requests"]
    assert req["sent"] == 3 and req["not_sent"] == 1 and req["unfinished"] == [2]
    assert req["sent"] == req["completed"] + req["failed"] + len(req["unfinished"])
    thr = s["throughput"]
    assert thr["output_tok_per_s"] == pytest.approx(20 / 1.04)
    assert thr["peak_output_tok_per_s"] == 20.0 >= thr["output_tok_per_s"]  # [0.5, 1.5) holds both chunks
    assert s["steady_state"]["output_tok_per_s"] is None


def test_run_json_is_strict_json(tmp_path: Path) -> None:
    from loadgen.report import write_json

    write_json({"rate": math.inf, "p99": math.nan, "nested": [1.5, -math.inf]}, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert doc == {"rate": None, "p99": None, "nested": [1.5, None]}


@pytest.mark.parametrize(
    "args",
    [
        ["--rate", "-1"],
        ["--max-concurrency", "0"],
        ["--users", "0"],
        ["--num-requests", "0"],
        ["--output-len", "-5"],
        ["--workload", "sharegpt"],
        ["--dataset", "/no/such/file.json"],
    ],
)
def test_bad_run_arguments_stop_with_a_message(args: list[str]) -> None:
    from loadgen.cli import build_parser
    from loadgen.specs import load_spec, workload_spec

    a = build_parser().parse_args(["run", "--engine", *args])
    with pytest.raises(SystemExit, match="loadgen: "):
        workload_spec(a)
        load_spec(a)


def test_no_abbreviated_flags_and_each_client_process_gets_its_share(tmp_path: Path) -> None:
    from loadgen.cli import build_parser
    from loadgen.fanout import _child_args

    with pytest.raises(SystemExit):  # `--client` would be taken for --client-procs, in every child too
        build_parser().parse_args(["run", "--engine", "--client", "2"])
    argv = ["run", "--base-url", "http://x", "--rate", "8", "--users", "5", "--warmup", "4", "--client-procs", "2"]
    a = build_parser().parse_args(argv)
    child = _child_args(argv, 1, 2, tmp_path, "lbl", a)
    value = {name: child[child.index(name) + 1] for name in ("--rate", "--users", "--warmup", "--shard")}
    assert value == {"--rate": "4.0", "--users": "3", "--warmup": "2", "--shard": "1/2"}
    assert child.count("--users") == 1 and "--client-procs" not in child


def test_sharegpt_keeps_its_reply_lengths_and_a_trace_all_its_lines(tmp_path: Path) -> None:
    from loadgen.cli import build_parser
    from loadgen.specs import workload_spec

    data = tmp_path / "d.json"
    data.write_text("[]")
    share = workload_spec(
        build_parser().parse_args(["run", "--engine", "--workload", "sharegpt", "--dataset", str(data)])
    )
    trace = workload_spec(build_parser().parse_args(["run", "--engine", "--workload", "trace", "--dataset", str(data)]))
    plain = workload_spec(build_parser().parse_args(["run", "--engine"]))
    assert (share.output_len, share.num_requests) == (0, 50)  # 0: each reply's own length
    assert trace.num_requests == 0  # 0: every line
    assert (plain.output_len, plain.num_requests) == (16, 50)

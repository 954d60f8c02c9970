"""loadgen against a scripted SSE server: timing, token counts, goodput, and every failure kind."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from loadgen.metrics import SLO, summarize
from loadgen.records import RequestRecord
from loadgen.runner import LoadSpec, Runner, RunOutput
from loadgen.target_http import HttpTarget
from loadgen.workloads import WorkItem
from tests.loadgen.fake_server import SCRIPT
from tests.loadgen.fake_server import FakeServerProcess as FakeServer
from tests.server.helpers import free_port

# Seconds: the tolerance for TTFT, ITL and E2E stamps on loopback. 15 ms failed once at 15.9 ms
# on a loaded 2-core machine (issue 18); the stamps are exact on an idle one.
TOL = 0.05
TOKENS = sum(n for _, n in SCRIPT)
TTFT = SCRIPT[0][0]
E2E = sum(d for d, _ in SCRIPT)
TPOT = (E2E - TTFT) / (TOKENS - 1)


def run_out(base_url: str, n: int, *, timeout: float = 10.0, **load: Any) -> RunOutput:
    async def main() -> RunOutput:
        target = HttpTarget(base_url, "fake", request_timeout=timeout)
        try:
            items = [WorkItem([i] * 8, None, TOKENS) for i in range(n)]  # the first id names the request
            return await Runner(target, LoadSpec(**load), progress=False).run(items)
        finally:
            await target.aclose()

    return anyio.run(main)


def run(
    base_url: str, n: int, *, slo: SLO | None = None, timeout: float = 10.0, **load: Any
) -> tuple[dict[str, Any], list[RequestRecord]]:
    out = run_out(base_url, n, timeout=timeout, **load)
    return summarize(out.records, slo or SLO(), last_send_s=out.last_send_s), out.records


def test_timings_and_token_counts_match_the_script() -> None:
    with FakeServer() as fake:
        out = run_out(fake.base_url, 6, rate=math.inf)
        server_log = fake.log
    summary = summarize(out.records, SLO(), last_send_s=out.last_send_s)
    assert summary["requests"]["completed"] == 6
    for r in out.records:
        log = server_log[r.index]
        recv, chunks, done = log["recv"][0], log["chunks"], log["done"][0]
        assert r.output_tokens == TOKENS and r.counted_tokens == TOKENS
        assert r.chunk_tokens == [n for _, n in SCRIPT]
        assert r.send_s is not None and r.done_s is not None
        # Every client stamp against the moment the server emitted (one clock, CLOCK_MONOTONIC):
        # never before it, and at most TOL after it.
        sent, arrived, ended = out.t0_perf + r.send_s, [out.t0_perf + t for t in r.chunk_s], out.t0_perf + r.done_s
        assert 0 <= recv - sent <= TOL
        for got, emitted in zip(arrived, chunks):
            assert 0 <= got - emitted <= TOL
        assert 0 <= ended - done <= TOL
        # Hence the derived latencies match the server's own within 2·TOL ...
        assert r.ttft == pytest.approx(chunks[0] - recv, abs=2 * TOL)
        assert r.e2e == pytest.approx(done - recv, abs=2 * TOL)
        assert r.tpot == pytest.approx((done - chunks[0]) / (TOKENS - 1), abs=2 * TOL / (TOKENS - 1))
        for gap, a, b in zip(r.itls, chunks, chunks[1:]):
            assert gap == pytest.approx(b - a, abs=TOL)
        # ... and the script, allowing for the server's sleeps running late.
        assert r.ttft == pytest.approx(TTFT, abs=3 * TOL)
        assert r.e2e == pytest.approx(E2E, abs=4 * TOL)
    lat = summary["latency_s"]
    assert lat["itl"]["count"] == 6 * (len(SCRIPT) - 1)
    assert lat["itl"]["p50"] == pytest.approx(SCRIPT[1][0], abs=TOL)
    assert lat["tpot"]["p50"] == pytest.approx(TPOT, abs=4 * TOL / (TOKENS - 1))
    assert summary["tokens_per_chunk"]["mean"] == pytest.approx(TOKENS / len(SCRIPT))
    assert summary["tokens"] == {"input": 6 * 8, "output": 6 * TOKENS}
    assert summary["token_check"]["usage_vs_counted_mismatch"] == []
    assert summary["token_check"]["output_len_vs_asked_mismatch"] == []
    assert summary["concurrency"]["max_in_flight"] == 6


def test_goodput_counts_slo_misses() -> None:
    with FakeServer() as fake:
        records = run(fake.base_url, 4, rate=math.inf)[1]
    met = summarize(records, SLO(ttft=TTFT + 0.05, e2e=E2E + 0.1))["goodput"]
    assert met["fraction"] == 1.0
    missed = summarize(records, SLO(ttft=TTFT + 0.05, e2e=E2E - 0.05))["goodput"]
    assert missed["fraction"] == 0.0 and missed["requests_per_s"] == 0.0
    tight_tpot = summarize(records, SLO(tpot=TPOT / 2))["goodput"]
    assert tight_tpot["fraction"] == 0.0


def test_usage_mismatch_and_wrong_length_are_flagged() -> None:
    with FakeServer(usage_completion=TOKENS + 1) as fake:
        summary = run(fake.base_url, 2, rate=math.inf)[0]
    check = summary["token_check"]
    assert len(check["usage_vs_counted_mismatch"]) == 2  # usage says 10, the stream carried 9
    assert len(check["output_len_vs_asked_mismatch"]) == 2  # asked for 9, usage says 10


def test_errors_disconnects_and_timeouts_are_counted_and_the_run_finishes() -> None:
    plan = ["ok", "400", "500", "disconnect", "hang"]
    with FakeServer(plan=plan, hang_s=3.0) as fake:
        summary, records = run(fake.base_url, 10, rate=math.inf, timeout=1.0, slo=SLO(e2e=5.0))
    f = summary["failures"]
    assert summary["requests"]["completed"] == 2
    assert summary["requests"]["failed"] == 8
    assert f["by_status"] == {"400": 2, "500": 2}
    assert f["by_type"]["HTTPStatus"] == 4
    assert f["by_type"]["Timeout"] == 2
    disconnects = sum(
        v for k, v in f["by_type"].items() if k in ("RemoteProtocolError", "IncompleteStream", "ReadError")
    )
    assert disconnects == 2, f["by_type"]
    assert any("scripted" in m for m in f["first_messages"].values())
    assert summary["goodput"]["fraction"] == pytest.approx(2 / 10)  # errors count against goodput
    assert summary["requests"]["unfinished"] == []
    assert all(r.finished for r in records)


def test_server_down_is_counted() -> None:
    summary = run(f"http://127.0.0.1:{free_port()}", 3, rate=math.inf, timeout=2.0)[0]
    assert summary["requests"]["failed"] == 3
    assert summary["failures"]["by_type"] == {"ConnectError": 3}


def test_run_timeout_lists_unfinished_requests() -> None:
    with FakeServer(plan=["hang"], hang_s=3.0) as fake:
        summary = run(fake.base_url, 3, rate=math.inf, timeout=10.0, run_timeout=0.5)[0]
    assert sorted(summary["requests"]["unfinished"]) == [0, 1, 2]


def test_max_concurrency_and_closed_loop() -> None:
    with FakeServer() as fake:
        capped = run(fake.base_url, 6, rate=math.inf, max_concurrency=2)[0]
        closed = run(fake.base_url, 6, users=3)[0]
    assert capped["concurrency"]["max_in_flight"] == 2
    assert capped["requests"]["completed"] == 6
    assert closed["concurrency"]["max_in_flight"] == 3
    assert closed["requests"]["completed"] == 6


def test_timed_closed_loop_cycles_the_workload() -> None:
    duration = 2.0
    with FakeServer() as fake:
        out = run_out(fake.base_url, 2, users=2, duration=duration)
    summary = summarize(out.records, SLO(), last_send_s=out.last_send_s)
    sent = summary["requests"]["sent"]
    # Each request takes about E2E (0.26 s), so two users make about 15 in 2 s from 2 prompts. A loaded
    # machine may slow requests down, so the count is bounded loosely: it cycles (more than 2 prompts) and
    # never exceeds what two users could send if every request took exactly the script's time.
    assert 2 < sent <= 2 * (math.floor(duration / E2E) + 1)
    assert summary["requests"]["failed"] == 0
    # Nothing starts after the duration, and a user stops only because the duration has passed.
    assert all(r.ready_s is not None and r.ready_s < duration for r in out.records)
    assert max(r.done_s or 0.0 for r in out.records) >= duration


def test_cli_without_model_needs_a_listed_one(tmp_path: Path) -> None:
    """No --model: loadgen asks /v1/models; a server that lists none is a clear error, not 404s."""
    from loadgen.cli import main

    with FakeServer() as fake, pytest.raises(SystemExit, match="lists no model; pass --model NAME"):
        main(["run", "--base-url", fake.base_url, "--no-progress", "--no-plots", "--out", str(tmp_path)])


def test_cli_trace_replay_and_sharegpt(tmp_path: Path) -> None:
    from loadgen.cli import main

    trace = tmp_path / "trace.jsonl"
    stamps = [0.0, 0.3, 0.35, 0.8]
    trace.write_text(
        "\n".join(json.dumps({"timestamp": 5 + t, "input_length": 6, "output_length": TOKENS}) for t in stamps)
    )
    conv = [
        {"conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "an answer"}]}
        for i in range(5)
    ]
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(json.dumps(conv))
    with FakeServer() as fake:
        base = ["run", "--base-url", fake.base_url, "--model", "fake", "--tokenizer", "gemma-3-270m"]
        base += ["--no-progress", "--no-plots", "--out", str(tmp_path)]
        assert main([*base, "--workload", "trace", "--dataset", str(trace), "--label", "tr"]) == 0
        assert main([*base, "--workload", "sharegpt", "--dataset", str(sharegpt), "--label", "sg"]) == 0
    sends = sorted(json.loads(line)["send_s"] for line in (tmp_path / "tr.jsonl").read_text().splitlines())
    assert sends == pytest.approx(stamps, abs=TOL)  # the trace's timestamps are the schedule
    sg = json.loads((tmp_path / "sg.json").read_text())
    assert sg["requests"]["completed"] == 5 and sg["run"]["workload"]["kind"] == "sharegpt"


def test_readiness_waits_for_health() -> None:
    async def main(url: str, limit: float) -> float:
        target = HttpTarget(url, "fake")
        try:
            t = time.perf_counter()
            await target.wait_ready(limit)
            return time.perf_counter() - t
        finally:
            await target.aclose()

    with pytest.raises(TimeoutError, match="not ready"):
        anyio.run(main, f"http://127.0.0.1:{free_port()}", 0.5)
    # /v1/models answers at once, but a loading server is not ready until /health says so.
    with FakeServer(loading_s=1.5) as fake:
        waited = anyio.run(main, fake.base_url, 10.0)
    assert 0.3 < waited < 2.5

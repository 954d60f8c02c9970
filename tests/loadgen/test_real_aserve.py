"""loadgen against the real thing on CPU: an `aserve serve` subprocess, and the in-process engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadgen.cli import main
from loadgen.server_view import parse_prometheus
from tests.server.helpers import API_KEY, ServerProcess

SERVED = "served-gemma"
PLOTS = ("cdf", "over_time", "itl_by_position", "timeline")
AUTH = {"Authorization": f"Bearer {API_KEY}"}
SMALL = ["--input-len", "8", "--output-len", "4", "--no-progress", "--slo", "ttft=5,tpot=1"]


@pytest.fixture(scope="module", params=["0", "2"], ids=["one-process", "api-workers-2"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # A served name that is not the model's: loadgen runs without --model must ask /v1/models.
    # Both server shapes: loadgen reads the same counters from a core behind front ends.
    proc = ServerProcess("--served-model-name", SERVED, "--api-workers", request.param,
                         log_path=tmp_path_factory.mktemp("loadgen_server") / "server.log")  # fmt: skip
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def check_outputs(out: Path, label: str, n: int) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((out / f"{label}.json").read_text())
    for name in PLOTS:
        png = out / f"{label}_{name}.png"
        assert png.stat().st_size > 5000, png
        assert png.read_bytes()[:4] == b"\x89PNG"
    lines = (out / f"{label}.jsonl").read_text().splitlines()
    measured = [json.loads(line) for line in lines if not json.loads(line)["warmup"]]
    assert len(measured) == n
    assert len((out / f"{label}.csv").read_text().splitlines()) == len(lines) + 1
    assert summary["requests"]["completed"] == n and summary["requests"]["failed"] == 0
    assert summary["run"]["complete"] is True
    assert summary["tokens"]["output"] == 4 * n  # ignore_eos and a fixed length: exact
    assert summary["tokens"]["input"] == 8 * n  # prompts built from token ids: exact
    check = summary["token_check"]
    assert check["output_len_vs_asked_mismatch"] == [] and check["prompt_len_mismatch"] == []
    for k in ("ttft", "tpot", "itl", "e2e"):
        assert summary["latency_s"][k]["p50"] > 0
    server = summary["server"]
    assert server["device_busy_s"] > 0 and server["engine_steps"] > 0 and "host_plan_s" in server
    return summary


def test_poisson_run_against_the_server(server: ServerProcess, tmp_path: Path) -> None:
    argv = ["run", "--base-url", server.base_url, "--api-key", API_KEY, "--num-requests", "50", "--rate", "25"]
    argv += ["--tokenizer", "gemma-3-270m"]
    assert main([*argv, *SMALL, "--warmup", "2", "--out", str(tmp_path), "--label", "srv"]) == 0
    summary = check_outputs(tmp_path, "srv", 50)
    assert summary["run"]["warmup_requests"] == 2
    assert summary["run"]["model"] == SERVED  # found at /v1/models; the tokenizer named by --tokenizer
    assert summary["server"]["output_tokens"] == 200  # warm-up happened before the "before" scrape
    assert summary["token_check"]["count_sources"] == {"tokenizer": 50}  # the chunks' text, tokenized


def test_in_process_engine_run(tmp_path: Path) -> None:
    argv = ["run", "--engine", "--engine-opt", "num_threads=2", "--num-requests", "50", "--rate", "25"]
    assert main([*argv, *SMALL, "--out", str(tmp_path), "--label", "eng"]) == 0
    check_outputs(tmp_path, "eng", 50)


def test_sweep_and_compare(server: ServerProcess, tmp_path: Path) -> None:
    argv = ["run", "--base-url", server.base_url, "--api-key", API_KEY, "--num-requests", "8", "--endpoint", "chat"]
    argv += ["--workload", "shared-prefix", "--groups", "2", "--per-group", "4", "--system-len", "8"]
    argv += ["--question-len", "4", "--output-len", "4", "--no-progress", "--sweep-rates", "20,inf", "--repeats", "2"]
    argv += ["--model", SERVED, "--tokenizer", "gemma-3-270m"]
    assert main([*argv, "--out", str(tmp_path), "--label", "sw"]) == 0
    for name in ("cdf_overlay", "over_time_overlay", "sweep_tput_vs_p99_tpot", "sweep_goodput_vs_rate"):
        assert (tmp_path / f"sw_{name}.png").stat().st_size > 5000
    a = ",".join(str(tmp_path / f"sw_rate20_rep{k}.json") for k in range(2))
    b = ",".join(str(tmp_path / f"sw_rateinf_rep{k}.json") for k in range(2))
    assert main(["compare", a, b, "--out", str(tmp_path / "cmp.json")]) == 0
    rows = {r["metric"]: r for r in json.loads((tmp_path / "cmp.json").read_text())["rows"]}
    assert rows["throughput.output_tok_per_s"]["ratios"][0]["ci95"] is not None


def test_overlap_ab_in_process(tmp_path: Path) -> None:
    argv = [
        "overlap-ab",
        "--engine",
        "--engine-opt",
        "num_threads=2",
        "--num-requests",
        "8",
        "--rate",
        "inf",
        "--seed",
        "1",
    ]
    assert main([*argv, *SMALL, "--repeats", "2", "--out", str(tmp_path), "--label", "ab"]) == 0
    result = json.loads((tmp_path / "ab_overlap_ab.json").read_text())
    assert len(result["fingerprints"]) == 1  # the identical workload in both modes
    side = result["server_side_by_side"]
    assert side["on"]["device_busy_s"] > 0 and side["off"]["device_busy_s"] > 0
    assert (tmp_path / "ab_overlap_cdf.png").exists()


def test_client_processes_merge_into_one_run(server: ServerProcess, tmp_path: Path) -> None:
    """--client-procs 3: three processes send a third each; one merged result on one clock.
    With --return-token-ids (passed on to each process) every chunk is counted from its ids."""
    argv = ["run", "--base-url", server.base_url, "--api-key", API_KEY, "--num-requests", "12", "--rate", "inf"]
    argv += ["--tokenizer", "gemma-3-270m", "--client-procs", "3", "--max-concurrency", "6", "--return-token-ids"]
    assert main([*argv, *SMALL, "--out", str(tmp_path), "--label", "fan"]) == 0
    summary = json.loads((tmp_path / "fan.json").read_text())
    assert summary["token_check"]["count_sources"] == {"token_ids": 12}
    assert summary["requests"]["completed"] == 12 and summary["requests"]["failed"] == 0
    assert summary["tokens"]["output"] == 4 * 12 and summary["run"]["client_procs"] == 3
    assert summary["server"]["output_tokens"] == 4 * 12  # the server saw exactly the merged run
    shards = [json.loads((tmp_path / "fan_clients" / f"fan_client{i}.json").read_text()) for i in range(3)]
    assert [s["requests"]["completed"] for s in shards] == [4, 4, 4]
    # Only the parent reads /metrics (around the whole run), not each process between go and send.
    assert [s["server"] for s in shards] == [None, None, None]
    lines = (tmp_path / "fan.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["index"] for line in lines) == list(range(12))  # the workload's own indexes
    sends = sorted(json.loads(line)["send_s"] for line in lines)
    assert sends[0] >= 0 and sends[-1] < summary["run"]["wall_s"]  # one timeline across the processes
    # They start together: no process is released (or sends) before every one is ready.
    barriers = [s["run"]["barrier"] for s in shards]
    last_ready = max(b["ready_perf"] for b in barriers)
    assert min(b["released_perf"] for b in barriers) >= last_ready
    assert min(s["run"]["t0_perf_counter"] for s in shards) >= last_ready
    assert summary["run"]["ready_spread_s"] == last_ready - min(b["ready_perf"] for b in barriers)
    # The clients' CPU over the run is the sum of the processes'; the host's busy share is a share.
    assert summary["client"]["cpu_s"] == sum(s["client"]["cpu_s"] for s in shards) > 0
    assert 0 < summary["host"]["busy_fraction"] <= 1


def test_a_client_process_that_fails_before_the_start_stops_the_run(server: ServerProcess, tmp_path: Path) -> None:
    """A process that cannot get ready (here: no such tokenizer) ends the run before anyone
    sends: the others are stopped, the exit status is 1, and the server saw no request."""
    argv = ["run", "--base-url", server.base_url, "--api-key", API_KEY, "--num-requests", "6", "--rate", "inf"]
    argv += ["--tokenizer", str(tmp_path / "missing.gguf"), "--client-procs", "2"]
    before = parse_prometheus(httpx.get(server.base_url + "/metrics", headers=AUTH, timeout=30).text)
    assert main([*argv, *SMALL, "--out", str(tmp_path), "--label", "broken"]) == 1
    after = parse_prometheus(httpx.get(server.base_url + "/metrics", headers=AUTH, timeout=30).text)
    assert after["output_tokens"] == before["output_tokens"]
    assert not (tmp_path / "broken.json").exists()

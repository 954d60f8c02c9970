"""Ctrl-C during ``loadgen run``: the run stops, requests in flight are cancelled and listed as
unfinished, and the files hold what was measured (one process, and ``--client-procs``, whose
parent passes the signal on to its clients once and merges what they wrote)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.loadgen.fake_server import ROOT, SCRIPT
from tests.loadgen.fake_server import FakeServerProcess as FakeServer

TOKENS = sum(n for _, n in SCRIPT)


@pytest.mark.parametrize("procs", [1, 2])
def test_ctrl_c_stops_the_run_and_writes_what_it_has(tmp_path: Path, procs: int) -> None:
    # Every other request hangs for a minute: those in flight at the signal never finish.
    with FakeServer(plan=["ok", "hang"], hang_s=60.0) as fake:
        cmd = [sys.executable, "-m", "loadgen", "run", "--base-url", fake.base_url, "--model", "fake",
               "--tokenizer", "gemma-3-270m", "--num-requests", "40", "--rate", "4", "--input-len", "8",
               "--output-len", str(TOKENS), "--no-progress", "--no-plots", "--out", str(tmp_path), "--label", "st",
               "--client-procs", str(procs)]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120  # a hang guard: the workload takes ~10 s unstopped
            # Stop once two "ok" streams have ended at the server (the first one's end then
            # had the client's loop for a whole stream since: it is read and counted) and four
            # requests came in (hung ones among them); a count of arrivals alone raced the
            # first stream's end on a loaded CI machine.
            while proc.poll() is None and time.monotonic() < deadline:
                if fake.received >= 4 and fake.finished >= 2:
                    break
                time.sleep(0.1)
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        received = fake.received
    assert proc.returncode == 0, err[-2000:]
    assert "SIGINT" in err
    summary = json.loads((tmp_path / "st.json").read_text())
    req = summary["requests"]
    assert summary["run"]["stopped_at_s"] is not None
    assert 4 <= received <= req["sent"] < 40  # one sent at the signal may not have reached the server
    assert req["unfinished"] and req["completed"] >= 1  # the hung ones; some of the others
    assert any("stopped early" in w for w in summary["warnings"])
    assert len((tmp_path / "st.jsonl").read_text().splitlines()) == req["sent"]


def test_ctrl_c_stops_an_overlap_ab_with_the_runs_so_far(tmp_path: Path) -> None:
    """overlap-ab (in-process engines): the first SIGINT stops the run under way, which is
    written; no comparison is made from a half A/B, and the exit status says so."""
    cmd = [sys.executable, "-m", "loadgen", "overlap-ab", "--engine", "--engine-opt", "num_threads=2",
           "--num-requests", "400", "--rate", "8", "--input-len", "8", "--output-len", "4", "--no-progress",
           "--no-plots", "--repeats", "2", "--out", str(tmp_path), "--label", "ab"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(12.0)  # the first engine starts in ~5 s here; its run takes ~50 s unstopped
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-2000:]
    assert "SIGINT" in err and "stopped early" in out and not (tmp_path / "ab_overlap_ab.json").exists()
    assert not (tmp_path / "ab_overlap_off_rep1.json").exists()
    first = tmp_path / "ab_overlap_off_rep0.json"
    if first.exists():  # stopped while it ran (not while its engine started, on a slow machine)
        summary = json.loads(first.read_text())
        assert summary["run"]["stopped_at_s"] is not None and 0 < summary["requests"]["sent"] < 400


def test_a_stop_during_the_warm_up_ends_the_run_at_its_start() -> None:
    """Stopped while the warm-up's requests hang: the warm-up ends, the measured run sends
    nothing and says it stopped at t=0 (a stop there once left the run without its warm-up
    records: UnboundLocalError)."""
    import anyio

    from loadgen.runner import LoadSpec, Runner
    from loadgen.target_http import HttpTarget
    from loadgen.workloads import WorkItem

    with FakeServer(plan=["hang"], hang_s=60.0) as fake:

        async def run() -> Any:
            target = HttpTarget(fake.base_url, "fake", request_timeout=120.0)
            runner = Runner(target, LoadSpec(warmup=2), progress=False, scrape=False)
            try:
                async with anyio.create_task_group() as tg:

                    async def stop_when_sent() -> None:
                        while fake.received < 2:
                            await anyio.sleep(0.05)
                        runner.stop()

                    tg.start_soon(stop_when_sent)
                    return await runner.run([WorkItem([i] * 8, None, TOKENS) for i in range(6)])
            finally:
                await target.aclose()

        out = anyio.run(run)
    assert out.stopped_at == 0.0 and out.records == []
    assert len(out.warmup_records) == 2 and not any(r.finished for r in out.warmup_records)

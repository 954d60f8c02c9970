"""loadgen soak: the process-tree sampler, the verdict, and a few seconds against a real `aserve serve`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadgen.cli import main
from loadgen.procstat import fd_kind, sample_tree
from loadgen.soak import PHASES, SoakSpec
from loadgen.soak_report import verdict
from tests.server.helpers import API_KEY, ServerProcess

# A parent that opens 10 fds and starts a child that opens 20 more and holds 50 MB.
PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(10)]
    child = subprocess.Popen([sys.executable, "-c", "import os, time; b = bytearray(50 * 2**20); "
                              "h = [os.open(os.devnull, os.O_RDONLY) for _ in range(20)]; print('ready', flush=True); "
                              "time.sleep(60)"], stdout=subprocess.PIPE)
    child.stdout.readline()
    print("ready", flush=True)
    time.sleep(60)
""")


def test_process_tree_sums_the_children() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        tree = sample_tree(proc.pid)
        assert tree is not None
        assert tree.procs == 2
        assert tree.fds >= 30 + 2 * 3  # the 30 opened, and each process's stdin/out/err
        assert tree.fd_kinds["file"] >= 30 and tree.fd_kinds.get("pipe", 0) >= 2
        assert tree.rss_bytes > 50 * 2**20  # the child's buffer is counted
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.1)
    assert sample_tree(proc.pid) is None  # reaped: gone, not an error


def test_fd_kinds() -> None:
    assert fd_kind("socket:[123]") == "socket"
    assert fd_kind("pipe:[9]") == "pipe"
    assert fd_kind("anon_inode:[eventfd]") == "anon_inode:eventfd"
    assert fd_kind("/dev/null") == "file"


def _timeline(
    rss_mib: list[float], *, fds: tuple[int, int] = (40, 40), kv_end: float = 0, errors: int = 0
) -> dict[str, Any]:
    """Samples at 1 s: start, a warm-up of 2, four quarters of 2 each, end."""
    phases = ["start", "warmup", "warmup", "q1", "q1", "q2", "q2", "q3", "q3", "q4", "q4", "end"]
    samples = []
    for i, (phase, rss) in enumerate(zip(phases, rss_mib)):
        fd = fds[0] if phase == "start" else fds[1] if phase == "end" else 60
        kv = kv_end if phase == "end" else (0 if phase == "start" else 500)
        samples.append({"t": float(i), "phase": phase, "rss_bytes": rss * 2**20, "fds": fd, "kv_used": kv,
                        "running": 0, "waiting": 0, "server_alive": True})  # fmt: skip
    return {
        "spec": {"rss_growth_limit_mib": 64.0, "fd_tolerance": 4, "sample_interval": 1.0},
        "samples": samples,
        "totals": {"ok": 100, "aborted": 10, "errors": errors, "abort_missed": 0},
        "errors": {"by_type": {"HTTP500": errors} if errors else {}, "first": []},
        "settle": {"settled": kv_end == 0, "seconds": 0.5},
    }


FLAT = [1000, 1010, 1020, 1030, 1031, 1029, 1030, 1032, 1030, 1031, 1033, 1030]


def test_verdict_passes_a_flat_run_and_names_each_failure() -> None:
    ok = verdict(_timeline(FLAT))
    assert ok["passed"], ok
    assert abs(ok["checks"]["rss_flat"]["growth_mib"]) < 5  # the warm-up's growth is left out

    leak = verdict(_timeline([1000, 1010, 1020, 1030, 1040, 1060, 1080, 1100, 1120, 1140, 1160, 1160]))
    assert not leak["passed"] and leak["checks"]["rss_flat"]["status"] == "fail"
    assert leak["checks"]["rss_flat"]["growth_mib"] == pytest.approx(115)
    assert leak["checks"]["rss_flat"]["slope_mib_per_hour"] > 0

    fds = verdict(_timeline(FLAT, fds=(40, 52)))
    assert [k for k, c in fds["checks"].items() if c["status"] == "fail"] == ["fds_back"]
    kv = verdict(_timeline(FLAT, kv_end=16))
    assert [k for k, c in kv["checks"].items() if c["status"] == "fail"] == ["kv_drained"]
    err = verdict(_timeline(FLAT, errors=1))
    assert [k for k, c in err["checks"].items() if c["status"] == "fail"] == ["no_errors"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(log_path=tmp_path_factory.mktemp("soak_server") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def test_short_soak_against_the_server(server: ServerProcess, tmp_path: Path) -> None:
    """A few seconds of soak: samples come, aborts happen and are not errors, the KV comes back to 0."""
    argv = ["soak", "--base-url", server.base_url, "--server-pid", str(server.proc.pid), "--api-key", API_KEY]
    argv += ["--tokenizer", "gemma-3-270m", "--duration", "6", "--warmup-s", "1", "--sample-interval", "0.5"]
    argv += [
        "--concurrency",
        "4",
        "--abort-rate",
        "0.5",
        "--input-len",
        "8",
        "--output-len",
        "8",
        "--range-ratio",
        "0.5",
    ]
    # Six seconds say nothing about memory growth; the limit here only keeps a loaded machine from failing it.
    argv += ["--rss-growth-limit-mib", "4096", "--no-progress", "--out", str(tmp_path), "--label", "s"]
    assert main(argv) == 0
    tl = json.loads((tmp_path / "s.json").read_text())
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "s_table.md").stat().st_size > 0

    samples = tl["samples"]
    assert len(samples) >= 4 and samples[0]["phase"] == "start" and samples[-1]["phase"] == "end"
    assert all(s["rss_bytes"] > 100 * 2**20 and s["fds"] > 0 for s in samples)
    assert max(s["kv_used"] for s in samples) > 0  # the gauge was read while requests ran
    assert samples[-1]["kv_used"] == 0 and samples[-1]["running"] == 0 and samples[-1]["waiting"] == 0

    tot = tl["totals"]
    assert tot["aborted"] >= 1 and tot["errors"] == 0 and tot["ok"] >= 1
    assert tl["errors"]["by_type"] == {}
    assert tl["server_outcomes"].get("abort", 0) >= 1  # the server saw the connections close
    assert tl["verdict"]["passed"] and tl["verdict"]["checks"]["kv_drained"]["status"] == "pass"
    ended = sum(p["ok"] + p["aborted"] for p in tl["phases"].values()) + tl["prewarm"]["ok"] + tl["prewarm"]["aborted"]
    assert ended == tot["ok"] + tot["aborted"]
    windows = [s["window"] for s in samples]
    assert sum(w["ok"] for w in windows) + tl["prewarm"]["ok"] == tot["ok"]  # every completion in one window


def test_phase_spans_of_a_soak_stopped_early() -> None:
    """Rates are per second of the phase as it ran: a stop cuts its phase short, empties the
    later ones, and the drain runs from the stop to the load's end."""
    spec = SoakSpec(duration=100.0, warmup_s=20.0)  # quarters of 20 s from t=20
    full = {p: spec.span(p, 103.0) for p in PHASES}
    assert full == {"warmup": 20.0, "q1": 20.0, "q2": 20.0, "q3": 20.0, "q4": 20.0, "drain": 3.0}
    cut = {p: spec.span(p, 55.0, stopped_at=50.0) for p in PHASES}
    assert cut == {"warmup": 20.0, "q1": 20.0, "q2": 10.0, "q3": 0.0, "q4": 0.0, "drain": 5.0}
    assert spec.span("warmup", 12.0, stopped_at=10.0) == 10.0
    assert all(spec.phase(t) == p for t, p in ((5, "warmup"), (45, "q2"), (99.9, "q4"), (100, "drain")))

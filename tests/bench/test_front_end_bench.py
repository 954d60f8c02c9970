"""The front-end bench end to end, small: a real front-end process and a real loadgen client
against the paced core; every token the core sent reaches the client, none fails."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import pytest

from aserve.bench.front_end import _measure

pytestmark = pytest.mark.slow


def test_every_paced_token_is_delivered(tiny_gemma: tuple[Path, object], tmp_path: Path) -> None:
    path = tiny_gemma[0]
    args = argparse.Namespace(streams="3", step_ms=2.0, tokens=7, waves=2, client_procs=1)
    before = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    result = asyncio.run(_measure(args, path, tmp_path))
    # Put back: later tests in this process (Ray Serve's replicas) read it, and the bench's
    # directory is gone.
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR") == before
    (row,) = result["rows"]
    assert row["failed"] == 0
    assert row["events"] == 3 * 2 * 7  # six requests of seven tokens, one event each
    assert row["front_end_cpu_s"] > 0 and row["delivered_tok_s"] > 0

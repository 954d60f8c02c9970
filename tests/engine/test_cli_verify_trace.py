"""`aserve verify`, `aserve info`, `aserve generate` and the Chrome trace, on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

import aserve
from aserve.cli import main


def test_verify_passes(tiny_llama: tuple[Path, Any], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["verify", "--model", str(tiny_llama[0]), "--num-requests", "16", "--no-warmup", "--page-size", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "OK: serial and overlap agree" in out and "ledger all free" in out


def test_info_and_generate(tiny_llama: tuple[Path, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--model", str(tiny_llama[0])]) == 0
    out = capsys.readouterr().out
    assert "kv_tokens" in out and "llama" in out
    assert main(["generate", "hello", "--model", str(tiny_llama[0]), "--max-tokens", "5", "--no-warmup"]) == 0
    assert capsys.readouterr().out.startswith("hello")


def test_bad_model_is_a_clean_cli_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--model", "/no/such/model"]) == 2
    assert "error:" in capsys.readouterr().err


def test_trace_file(tiny_llama: tuple[Path, Any], tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"

    async def run() -> None:
        async with aserve.Engine(model=str(tiny_llama[0]), trace_path=str(trace), warmup=False) as engine:
            await engine.complete([1, 5, 6], aserve.SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))

    anyio.run(run)
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["name"] for e in events}
    assert {"plan", "launch", "commit"} <= names
    assert any(n.startswith("step ") for n in names)  # device spans
    assert any(n.endswith(":queued") for n in names) and any(n.endswith(":finished:length") for n in names)
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 for e in spans)

"""Leaving ``Engine.generate`` early aborts the request.

``async for`` never closes its iterator, so a plain ``break`` only aborts once the generator
is closed: explicitly (``contextlib.aclosing``, the documented form) or when it is dropped.
Found in review: the inner generator used to be left to the garbage collector even after
an explicit ``aclose()`` of the outer one.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import anyio
import pytest

import aserve


def test_break_out_of_generate_aborts_request(tiny_llama: tuple[Path, Any]) -> None:
    path, _ = tiny_llama
    params = aserve.SamplingParams(max_tokens=300, temperature=0, ignore_eos=True)

    async def run() -> tuple[int, int]:
        cfg = aserve.EngineConfig(model=str(path), debug=True, warmup=False, overlap=True)
        async with aserve.Engine(cfg) as engine:
            async with contextlib.aclosing(engine.generate([1, 5, 6, 7], params)) as stream:
                async for _delta in stream:
                    break
            with anyio.fail_after(20):
                while engine.stats().running or engine.stats().waiting or not engine.ledger().all_free:
                    await anyio.sleep(0.01)
            result = engine.requests_aborted, engine.requests_finished
        return result

    aborted, finished = anyio.run(run)
    assert (aborted, finished) == (1, 0), "the request ran to max_tokens after its consumer left"


def test_open_stream_validates_now_and_aclose_aborts_unstarted(tiny_llama: tuple[Path, Any]) -> None:
    path, _ = tiny_llama

    async def run() -> None:
        async with aserve.Engine(model=str(path), warmup=False, overlap=True) as engine:
            with pytest.raises(aserve.InvalidRequestError):
                engine.open_stream([], aserve.SamplingParams())  # raises before any await
            stream = engine.open_stream([1, 5, 6], aserve.SamplingParams(max_tokens=300, ignore_eos=True))
            await anyio.sleep(0.05)  # it runs although nobody iterates yet
            assert engine.stats().running == 1
            await stream.aclose()  # never iterated: still aborts
            with anyio.fail_after(10):
                while not engine.ledger().all_free:
                    await anyio.sleep(0.01)
            assert engine.requests_aborted == 1
            full = engine.open_stream([1, 5, 6], aserve.SamplingParams(max_tokens=4, ignore_eos=True))
            got = [t async for d in full for t in d.token_ids]
            assert len(got) == 4

    anyio.run(run)

"""A failure on the device stream surfaces as a typed error to every waiting caller."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import aserve
from aserve.device.forward import StepForward


def test_device_error_fails_requests_cleanly(tiny_llama: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    real = StepForward.run
    calls = {"n": 0}

    def flaky(self: StepForward, dev: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("injected device failure")
        return real(self, dev)

    monkeypatch.setattr(StepForward, "run", flaky)
    errors: list[BaseException] = []

    async def run() -> None:
        async with aserve.Engine(model=str(tiny_llama[0]), warmup=False) as engine:

            async def one(i: int) -> None:
                try:
                    await engine.complete([1, 5 + i, 6], aserve.SamplingParams(max_tokens=50, ignore_eos=True))
                except aserve.AserveError as exc:
                    errors.append(exc)

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    for i in range(4):
                        tg.start_soon(one, i)
            with pytest.raises(aserve.EngineFailedError, match="failed on the device"):
                await engine.complete([1, 2, 3], aserve.SamplingParams(max_tokens=2))

    anyio.run(run)
    assert len(errors) == 4
    # One typed error for everyone in flight, naming the fault (a subclass of EngineClosedError: 503).
    assert all(isinstance(e, aserve.EngineFailedError) and "injected device failure" in str(e) for e in errors)

"""A child process for tests/engine/test_watchdog_backstop.py: an engine whose event loop gets
blocked while a step is in flight. ``python -m tests.engine.blocked_loop_child MODEL DEVICE``.

cpu: the second step's device work is slow (3 s on the stream's thread), so the commit loop
waits on it, and the third launch then sleeps on the loop's thread (a call that never returns).
cuda: the first forward (the prefill; decode steps replay graphs) first enqueues a ~60 s spin
kernel; the H200 showed the next CUDA call of such a forward blocking the loop's thread while
the device spins. Should the loop keep running instead, the coroutine watchdog ends the request
cleanly: the child then prints "clean failure" and exits 3.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import anyio

import aserve
from aserve.device.forward import StepForward
from aserve.device.runner import ModelRunner


def main(model: str, device: str) -> None:
    calls = {"n": 0, "work": 0}
    real_launch = ModelRunner.launch
    real_work = StepForward.run

    def device_work(self: StepForward, dev: Any) -> Any:
        calls["work"] += 1
        if device == "cpu" and calls["work"] == 2:
            time.sleep(3)
        return real_work(self, dev)

    StepForward.run = device_work  # type: ignore[method-assign]

    def launch(self: ModelRunner, *args: Any, **kw: Any) -> Any:
        calls["n"] += 1
        step = real_launch(self, *args, **kw)
        if device == "cpu" and calls["n"] == 3:
            time.sleep(120)  # the loop's thread never comes back in time
        return step

    ModelRunner.launch = launch  # type: ignore[method-assign]

    async def run() -> None:
        async with aserve.Engine(model=model, device=device, dtype="float32", warmup=False,
                                 watchdog_timeout=0.5) as engine:  # fmt: skip
            if device == "cuda":
                import torch

                model_ = engine.runner.model
                real = model_.forward

                def spin(*args: Any) -> Any:
                    calls["f"] = calls.get("f", 0) + 1
                    if calls["f"] == 1:
                        torch.cuda._sleep(int(60 * 2e9))  # ~60 s at ~2 GHz
                    return real(*args)

                model_.forward = spin  # type: ignore[method-assign]
            print("serving", flush=True)
            await engine.complete([1, 5, 6, 7], aserve.SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
        print("finished without the watchdog", flush=True)

    try:
        anyio.run(run)
    except aserve.EngineFailedError as exc:
        print(f"clean failure: {exc}", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

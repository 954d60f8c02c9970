"""Test-only: ``python -m tests.server.fault_launcher FAULT serve ARGS...`` is ``aserve serve
ARGS...`` with a fault planted in the model (production code has no switch for it).

FAULT is ``forward`` (the model's forward raises) or ``stall`` (it never returns: the CPU
stream's thread blocks, and the step's results never arrive). It fires on the first forward
whose input holds ``TRIGGER`` at least three times, which only a prompt can do: a decode step
carries one token per request and the test runs at most two. After a fault the engine's close
is held, as a CUDA engine's teardown takes a while, so that the test reads the server's answers
while the engine closes instead of racing the process's exit: until the file named by
``ASERVE_TEST_RELEASE`` exists (the test creates it once it has read them; a fixed hold lost
that race on a loaded machine), or ``HOLD_S`` seconds without it.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import anyio

TRIGGER = 333
HOLD_S = 4.0
HOLD_MAX_S = 120.0


def plant(fault: str) -> None:
    from aserve.engine.engine import Engine
    from aserve.models.causal_lm import CausalLM

    real_forward = CausalLM.forward
    never = threading.Event()

    def forward(self: CausalLM, input_ids: Any, *args: Any) -> Any:
        if int((input_ids == TRIGGER).sum()) >= 3:
            if fault == "forward":
                raise RuntimeError("injected fault in the model's forward")
            never.wait()
        return real_forward(self, input_ids, *args)

    real_aclose = Engine.aclose

    async def aclose(self: Engine) -> None:
        if self.failure is not None:
            release = os.environ.get("ASERVE_TEST_RELEASE")
            if release is None:
                await anyio.sleep(HOLD_S)
            else:
                with anyio.move_on_after(HOLD_MAX_S):
                    while not os.path.exists(release):  # noqa: ASYNC240 (a test hook, polled)
                        await anyio.sleep(0.05)
        await real_aclose(self)

    CausalLM.forward = forward  # type: ignore[method-assign]
    Engine.aclose = aclose  # type: ignore[method-assign]


def main() -> int:
    fault, *argv = sys.argv[1:]
    assert fault in ("forward", "stall"), f"unknown fault {fault!r}"
    plant(fault)
    from aserve.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())

"""Run an engine inside its own task, so a pytest-asyncio fixture may start and stop it.

pytest-asyncio runs an async fixture's setup and teardown in different tasks, while an
anyio task group (the engine's) must be entered and exited by the same task. This host
task owns the ``async with Engine(...)`` block for the fixture's whole life.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aserve


@asynccontextmanager
async def hosted_engine(**kwargs: Any) -> AsyncIterator[aserve.Engine]:
    ready: asyncio.Future[aserve.Engine] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def host() -> None:
        try:
            async with aserve.Engine(**kwargs) as engine:
                ready.set_result(engine)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    task = asyncio.create_task(host())
    try:
        yield await ready
    finally:
        stop.set()
        await task

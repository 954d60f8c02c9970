"""Pipeline slots: the one number that separates serial (depth 1) from overlap (depth 2, or 3)."""

from __future__ import annotations

from aserve.sync import Signal


class PipelineSlots:
    """At most ``depth`` steps are planned-or-in-flight and not yet committed.

    The planner takes a slot before planning and the committer returns it after committing.
    Depth 1: each step is committed before the next is planned (serial). Depth 2: the device
    runs step n while the host commits n-1 and plans n+1 (SGLang's overlap). Depth 3: the host
    may queue two steps ahead of the device, so one slow host step does not idle it (the
    default with CUDA graphs). A request whose next input reads committed state (penalties)
    keeps a look-ahead of one whatever the depth (``Scheduler.schedule``).
    """

    def __init__(self, depth: int) -> None:
        assert depth in (1, 2, 3), f"pipeline depth must be 1, 2 or 3, got {depth}"
        self.depth = depth
        self.in_use = 0
        self._changed = Signal()

    async def acquire(self) -> None:
        """Wait for a free slot. Cancellation while waiting takes nothing."""
        while self.in_use >= self.depth:
            await self._changed.wait()
        self.in_use += 1

    def release(self) -> None:
        assert self.in_use > 0, "released a pipeline slot nobody held"
        self.in_use -= 1
        self._changed.set()

    async def wait_until(self, in_use: int) -> None:
        """Wait until at most ``in_use`` slots are held (``0``: the pipeline is drained)."""
        while self.in_use > in_use:
            await self._changed.wait()

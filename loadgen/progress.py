"""The live progress line: completed, in flight, failed, rolling output tok/s (rich)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import anyio
from rich.console import Console
from rich.live import Live
from rich.text import Text

from loadgen.records import RequestRecord

WINDOW_S = 5.0


def snapshot(records: Sequence[RequestRecord], now: float) -> dict[str, float]:
    done = sum(1 for r in records if r.finished and r.error_type is None)
    failed = sum(1 for r in records if r.error_type is not None)
    in_flight = sum(1 for r in records if r.send_s is not None and not r.finished)
    recent = 0
    for r in records:
        # Walk each record's chunks from the newest back: old chunks are never read again.
        for t, n in zip(reversed(r.chunk_s), reversed(r.chunk_tokens)):
            if t < now - WINDOW_S:
                break
            recent += n
    return {"done": done, "failed": failed, "in_flight": in_flight, "tok_s": recent / min(WINDOW_S, max(now, 1e-3))}


class Progress:
    def __init__(self, records: Sequence[RequestRecord], now: Callable[[], float], *, enabled: bool) -> None:
        self.records = records
        self.now = now
        self.enabled = enabled
        self._live: Live | None = None

    def _render(self) -> Text:
        s = snapshot(self.records, self.now())
        return Text(
            f"t={self.now():7.1f}s  completed {s['done']:.0f}  in flight {s['in_flight']:.0f}  "
            f"failed {s['failed']:.0f}  output {s['tok_s']:.1f} tok/s (last {WINDOW_S:g}s)"
        )

    async def loop(self) -> None:
        if not self.enabled:
            return
        self._live = Live(self._render(), console=Console(file=sys.stderr), refresh_per_second=4, transient=False)
        self._live.start()
        while True:
            self._live.update(self._render())
            await anyio.sleep(0.25)

    def close(self) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.stop()
            self._live = None

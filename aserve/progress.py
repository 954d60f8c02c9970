"""What a long start-up or command is doing, shown on a terminal and logged everywhere.

``with phase("loading weights") as update:`` prints the phase's name on stderr, then a tqdm bar
once ``update(done, total)`` is called, or a line with the phase's time when it never is; only when stderr is
a terminal, so pipes, CI logs and JSON log collectors get no bar characters. Every phase also
ends with a ``phase_done`` log line with its duration (an INFO line in ``aserve serve``'s log).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aserve.logs import get_logger

log = get_logger("aserve.progress")

Progress = Callable[[int, int], None]  # update(done, total)


def on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


class _Bar:
    def __init__(self, name: str, unit: str, show: bool) -> None:
        self.name = name
        self.unit = unit
        self.show = show
        self.used = False
        self._bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        self.used = True
        if not self.show:
            return
        if self._bar is None:
            from tqdm import tqdm

            # A pseudo-terminal nobody sized (`docker exec -t`, `script`, CI runners) reports 0 rows
            # and columns, and tqdm hides a bar below the last row: with 0 rows it drew nothing at
            # all. shutil's size falls back to 80x24 there.
            size = shutil.get_terminal_size()
            self._bar = tqdm(total=total, desc=self.name, unit=self.unit, file=sys.stderr, leave=True,
                             ncols=size.columns, nrows=size.lines)  # fmt: skip
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@contextmanager
def phase(name: str, unit: str = "it", **fields: Any) -> Iterator[Progress]:
    """A named stage of start-up or of a command; yields its ``update(done, total)``."""
    show = on_terminal()
    bar = _Bar(name, unit, show)
    if show:
        print(f"{name} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        yield bar
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    if show and not bar.used:  # a bar shows its own elapsed time
        print(f"{name}: done in {seconds:.1f} s", file=sys.stderr, flush=True)
    log.info("phase_done", phase=name, seconds=round(seconds, 3), **fields)

"""The watchdog's backstop: a thread for when the event loop itself is stuck.

The watchdog proper is a timeout in the commit loop (``StepLoop._commit_loop``): a step whose
results do not come back within ``watchdog_timeout`` fails every request with a typed error and
closes the engine. That needs the event loop to run. On CUDA a stalled device can also block the
loop's own thread inside a CUDA call (seen on the H200: the next forward's first kernel launch
waited on the spinning device), and then no coroutine runs again.

This thread watches from outside: when the oldest step in flight was launched (or a launch under
way began) longer ago than the limit plus a grace period and the coroutine watchdog has still not
fired, the loop is blocked. Nothing can
end the requests cleanly from here, so it does what SGLang's watchdog does: it writes every
thread's stack to stderr and ends the process (status 70, EX_SOFTWARE), so that a supervisor
restarts the server and an embedding application is not left hanging forever.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable

from aserve.logs import get_logger

log = get_logger("aserve.watchdog")

EXIT_STATUS = 70  # EX_SOFTWARE
_MIN_GRACE_S = 5.0


class LoopWatchdog:
    """Ends the process when ``oldest_launch()`` (monotonic) is older than ``limit_s`` + grace
    and ``fired()`` (the coroutine watchdog, or any other fault) is still false."""

    def __init__(self, limit_s: float, oldest_launch: Callable[[], float | None], fired: Callable[[], bool]) -> None:
        self.limit_s = limit_s
        self.grace_s = max(_MIN_GRACE_S, limit_s)
        self._oldest_launch = oldest_launch
        self._fired = fired
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aserve-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        period = min(1.0, self.limit_s / 2)
        while not self._stop.wait(period):
            since = self._oldest_launch()
            if since is None or self._fired():
                continue
            waited = time.monotonic() - since
            if waited > self.limit_s + self.grace_s:
                self._end_process(waited)
                return

    def _end_process(self, waited: float) -> None:
        log.critical(
            "engine_watchdog_loop_blocked",
            waited_s=round(waited, 1),
            limit_s=self.limit_s,
            hint="a step did not complete and the event loop did not run for the watchdog either "
            "(blocked in a device call); ending the process",
        )
        print(
            f"aserve: a step has not completed for {waited:.1f} s (watchdog_timeout {self.limit_s:g} s) and the "
            "event loop is blocked; every thread's stack follows, then the process exits "
            f"with status {EXIT_STATUS}",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(EXIT_STATUS)

"""Gates the host opens: work queued on a stream now that the device (or the CPU stream's
worker) runs only once the host says so.

A queued split step (``ASERVE_QUEUED_SAMPLER=1``, docs/architecture.md "Structured outputs")
launches its sampler with its forward, behind a gate; the masks are filled later, after the
commits of the steps before it, and opening the gate is then the host's only launch work. On
CUDA a gate is one program spinning on a word of pinned host memory (aserve/kernels/gate.py),
replayed from a CUDA graph; the host opens the gates of a runner in the order it shut them, by
storing a count there. On a CPU it is a :class:`threading.Event` the stream's worker waits on.
Every gate still shut is opened when the runner closes or the engine fails, so no stream waits
forever (what runs behind an opened gate then is never committed).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Hashable
from typing import Any

import torch

from aserve.device.events import CpuStream


class HostGates:
    """The gates of one runner's queued steps, each opened once (by its fill, or by
    :meth:`open_all`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._open: dict[Hashable, Callable[[], None]] = {}  # gate key -> opens it
        self._lock = threading.Lock()
        self._graph: Any = None  # the gate kernel, captured (CUDA)
        self._opened: torch.Tensor | None = None  # pinned int64: the last turn the host opened
        self._passed: torch.Tensor | None = None  # on the device: gates passed so far
        self._opened_ptr = 0
        self._turns = 0  # gates queued so far
        self._high = 0  # the last turn opened (what the pinned word holds)

    def shut(self, key: Hashable, stream: Any) -> Callable[[], None]:
        """Queue a gate named ``key`` (a step's index, or its index and a chunk) on ``stream``
        (a CUDA stream or a :class:`CpuStream`): work queued after it runs once the returned
        callable opens it (idempotent)."""
        if isinstance(stream, CpuStream):
            event = threading.Event()

            def wait() -> None:
                event.wait()

            stream.submit(wait)
            return self._track(key, event.set)
        turn = self._cuda_gate(stream)
        return self._track(key, lambda: self._open_turn(turn))

    def _open_turn(self, turn: int) -> None:
        """Let the gates up to ``turn`` pass (CUDA). Gates pass in order: a later turn opens the
        earlier ones too (the step loop fills, and opens, in launch order). Under the lock, so
        that the word never goes back (a helper's open against :meth:`open_all`'s)."""
        with self._lock:
            if turn > self._high:
                self._high = turn
                ctypes.c_int64.from_address(self._opened_ptr).value = turn

    def _track(self, key: Hashable, open_: Callable[[], None]) -> Callable[[], None]:
        def once() -> None:
            with self._lock:
                fn = self._open.pop(key, None)
            if fn is not None:
                fn()

        with self._lock:
            self._open[key] = open_
        return once

    def open_all(self) -> None:
        """Open every gate still shut (the runner closes, or the engine failed)."""
        with self._lock:
            fns, self._open = list(self._open.values()), {}
        for fn in fns:
            fn()

    def release(self) -> None:
        """The runner closed and its streams' work has finished: every gate open, the captured
        kernel and its words dropped (a later gate captures them again)."""
        self.open_all()
        self._graph = self._opened = self._passed = None
        self._opened_ptr = self._turns = self._high = 0

    @property
    def turns(self) -> int:
        """Gates queued on CUDA so far."""
        return self._turns

    @property
    def shut_count(self) -> int:
        with self._lock:
            return len(self._open)

    def prepare(self, stream: Any) -> None:
        """On CUDA, compile and capture the gate kernel now (at start, not inside the first
        queued step: the capture synchronizes the device); nothing on a CPU."""
        if self.device.type == "cuda" and self._graph is None:
            self._capture(stream)

    def _cuda_gate(self, stream: Any) -> int:
        """Queue the next gate on ``stream`` (a replay of the one-kernel graph); its turn."""
        self.prepare(stream)
        assert self._graph is not None
        self._turns += 1
        with torch.cuda.stream(stream):
            self._graph.replay()
        return self._turns

    def _capture(self, stream: Any) -> None:
        from aserve.kernels.gate import gate_

        # 64-bit turns: no wrap-around in the life of a server.
        opened = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        passed = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._opened, self._passed, self._opened_ptr = opened, passed, opened.data_ptr()
        with torch.cuda.stream(stream):
            opened[0] = 1
            gate_(opened, passed)  # compiled (and passed) before the capture: turn 1
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(stream)
            # Thread-local: the engine's event-waiter thread may query events meanwhile.
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                gate_(opened, passed)
            stream.wait_stream(side)
        self._graph, self._turns, self._high = graph, 1, 1

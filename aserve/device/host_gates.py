"""Gates the host opens: work queued on a stream now that the device (or the CPU stream's
worker) runs only once the host says so.

A queued split step (``ASERVE_QUEUED_SAMPLER=1``, docs/architecture.md "Structured outputs")
launches its sampler with its forward, behind a gate; the masks are filled later, after the
commits of the steps before it, and opening the gate is then the host's only launch work. On
CUDA a gate is ``cuStreamWaitValue32`` on a word of pinned host memory, which the host opens by
storing the step's number there; on a CPU it is a :class:`threading.Event` the stream's worker
waits on. Every gate still shut is opened when the runner closes or the engine fails, so no
stream waits forever (what runs behind an opened gate then is never committed).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import torch

from aserve.device.events import CpuStream

_WAIT_EQ = 0x1  # CU_STREAM_WAIT_VALUE_EQ
_SLOTS = 256  # words of the ring; a slot is reused by the step 256 launches later


class HostGates:
    """The gates of one runner's queued steps, each opened once (by its fill, or by
    :meth:`open_all`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._open: dict[int, Callable[[], None]] = {}  # step index -> opens its gate
        self._lock = threading.Lock()
        self._words: torch.Tensor | None = None
        self._wait: Any = None
        self._base = 0

    def shut(self, index: int, stream: Any) -> Callable[[], None]:
        """Queue a gate for step ``index`` on ``stream`` (a CUDA stream or a :class:`CpuStream`):
        work queued after it runs once the returned callable opens it (idempotent)."""
        if isinstance(stream, CpuStream):
            event = threading.Event()

            def wait() -> None:
                event.wait()

            stream.submit(wait)
            return self._track(index, event.set)
        words = self._cuda_words()
        slot, value = index % _SLOTS, index & 0x7FFFFFFF
        words[slot] = -1  # its last user, 256 steps back, has long passed its gate
        rc = self._wait(ctypes.c_void_p(stream.cuda_stream), self._base + 4 * slot, value, _WAIT_EQ)
        if rc != 0:
            raise RuntimeError(f"cuStreamWaitValue32 failed with CUresult {rc}")

        def open_() -> None:
            words[slot] = value

        return self._track(index, open_)

    def _track(self, index: int, open_: Callable[[], None]) -> Callable[[], None]:
        def once() -> None:
            with self._lock:
                fn = self._open.pop(index, None)
            if fn is not None:
                fn()

        with self._lock:
            self._open[index] = open_
        return once

    def open_all(self) -> None:
        """Open every gate still shut (the runner closes, or the engine failed)."""
        with self._lock:
            fns, self._open = list(self._open.values()), {}
        for fn in fns:
            fn()

    @property
    def shut_count(self) -> int:
        with self._lock:
            return len(self._open)

    def _cuda_words(self) -> torch.Tensor:
        if self._words is None:
            lib = ctypes.CDLL("libcuda.so.1")
            wait = getattr(lib, "cuStreamWaitValue32_v2", None) or lib.cuStreamWaitValue32
            wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            words = torch.zeros(_SLOTS, dtype=torch.int32).pin_memory()
            ptr = ctypes.c_uint64()
            rc = lib.cuMemHostGetDevicePointer_v2(ctypes.byref(ptr), ctypes.c_void_p(words.data_ptr()), 0)
            if rc != 0:
                raise RuntimeError(f"cuMemHostGetDevicePointer failed with CUresult {rc}")
            self._wait, self._base, self._words = wait, ptr.value, words
        return self._words

"""The engine's CUDA streams: entering one cheaply, and reusing a closed engine's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

S = TypeVar("S")


class StreamPool(Generic[S]):
    """Stream sets of closed runners, by device, for the next runner on that device.

    torch keeps a cuBLAS workspace for every stream a matmul ran on (32 MiB each on an H100)
    for the life of the process. With new streams for every engine, five engines created and
    closed in turn on an H100 host left 945, 979, 1,013, 1,046 and 1,080 MB reserved (torch
    cycles through 32 streams a device, so up to ~1 GiB in all). Reused streams reuse their
    workspaces. (Dropping every workspace when the last engine closes,
    with ``torch._C._cuda_clearCublasWorkspaces``, would also stop the growth, but it is
    process-wide: a graph the embedding program captured with cuBLAS would replay against freed
    memory.) A set goes back only once its work has finished; after a stall, never.
    """

    def __init__(self) -> None:
        self._idle: dict[int, list[S]] = {}
        self._lock = threading.Lock()  # engines may start and close in different threads

    def take(self, device_index: int, make: Callable[[], S]) -> S:
        """An idle set of this device's, else a new one from ``make``."""
        with self._lock:
            idle = self._idle.get(device_index)
            if idle:
                return idle.pop()
        return make()

    def give_back(self, device_index: int, streams: S) -> None:
        with self._lock:
            self._idle.setdefault(device_index, []).append(streams)

    def idle(self, device_index: int) -> int:
        with self._lock:
            return len(self._idle.get(device_index, ()))


def _new_runner_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]:
    return torch.cuda.Stream(device), torch.cuda.Stream(device), torch.cuda.Stream(device)


# A runner's schedule, forward and copy streams.
RUNNER_STREAMS: StreamPool[tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]] = StreamPool()


def take_runner_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return RUNNER_STREAMS.take(index, lambda: _new_runner_streams(torch.device("cuda", index)))


def give_back_runner_streams(streams: tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]) -> None:
    RUNNER_STREAMS.give_back(streams[0].device_index, streams)


class on_stream:
    """``with torch.cuda.stream(stream)`` without the device lookups that context makes on
    every entry (``_get_device_index`` twice, each through ``torch.cuda.is_available()``):
    ~75 us an entry in a cProfile of the H100 host's loop, four or five entries a step
    (docs/benchmarks.md, twelfth session). Like that context, it leaves the current device
    and its stream as they were."""

    __slots__ = ("_device_prev", "_prev", "_stream")

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self._stream = (stream.stream_id, stream.device_index, stream.device_type)
        self._prev: Any = None
        self._device_prev: Any = None

    def __enter__(self) -> None:
        # As torch.cuda.StreamContext: setting a stream makes its device current, so the
        # current device's stream is kept too and restored last (the device with it).
        sid, index, kind = self._stream
        device = torch._C._cuda_getDevice()
        self._device_prev = torch._C._cuda_getCurrentStream(device)
        self._prev = torch._C._cuda_getCurrentStream(index) if device != index else None
        torch._C._cuda_setStream(stream_id=sid, device_index=index, device_type=kind)

    def __exit__(self, *exc: object) -> None:
        if self._prev is not None:
            sid, index, kind = self._prev
            torch._C._cuda_setStream(stream_id=sid, device_index=index, device_type=kind)
        sid, index, kind = self._device_prev
        torch._C._cuda_setStream(stream_id=sid, device_index=index, device_type=kind)

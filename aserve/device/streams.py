"""Entering one of the engine's CUDA streams, cheaply."""

from __future__ import annotations

from typing import Any

import torch


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

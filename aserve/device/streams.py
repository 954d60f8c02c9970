"""Entering one of the engine's CUDA streams, cheaply."""

from __future__ import annotations

from typing import Any

import torch


class on_stream:
    """``with torch.cuda.stream(stream)`` without the device lookups that context makes on
    every entry (``_get_device_index`` twice, each through ``torch.cuda.is_available()``):
    ~75 us an entry in a cProfile of the H100 host's loop, four or five entries a step
    (docs/benchmarks.md, twelfth session). The engine's streams are all on its one device."""

    __slots__ = ("_prev", "_stream")

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self._stream = (stream.stream_id, stream.device_index, stream.device_type)
        self._prev: Any = None

    def __enter__(self) -> None:
        sid, index, kind = self._stream
        self._prev = torch._C._cuda_getCurrentStream(index)
        torch._C._cuda_setStream(stream_id=sid, device_index=index, device_type=kind)

    def __exit__(self, *exc: object) -> None:
        sid, index, kind = self._prev
        torch._C._cuda_setStream(stream_id=sid, device_index=index, device_type=kind)

"""Run a module's main with a split step's masks copied in two halves on two streams (the
schedule stream and a side stream, which starts after and rejoins it), in case one copy
engine's rate is what limits the upload (``DecodeGraphs.upload_masks`` copies on one stream).

    python masks_two_streams.py aserve.bench.device_bench --only structured ...
"""

import runpy
import sys

import torch

from aserve.device.decode_graphs import DecodeGraphs

_side: dict[int, torch.cuda.Stream] = {}


def two_streams(self: DecodeGraphs, size: int) -> None:
    m = self.masked
    assert m is not None
    here = torch.cuda.current_stream()
    side = _side.setdefault(here.device.index or 0, torch.cuda.Stream(here.device))
    half = size // 2
    side.wait_stream(here)
    m.device_bits[:half].copy_(m.host_bits[:half], non_blocking=True)
    with torch.cuda.stream(side):
        m.device_bits[half:size].copy_(m.host_bits[half:size], non_blocking=True)
    here.wait_stream(side)


DecodeGraphs.upload_masks = two_streams  # type: ignore[method-assign]
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
runpy.run_module(module, run_name="__main__")

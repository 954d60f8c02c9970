"""Run a module's main with a split step's masks copied as before session 24's change: on the
forward stream right before the masked-argmax replay (so after the step's forward), instead of
on the schedule stream beside the forward (``DecodeGraphs.upload_masks``).

    python masks_in_line.py aserve.bench.device_bench --only structured ...
"""

import runpy
import sys

from aserve.device.decode_graphs import DecodeGraphs

replay = DecodeGraphs.masked_argmax


def in_line(self: DecodeGraphs, size: int) -> None:
    m = self.masked
    assert m is not None
    m.device_bits[:size].copy_(m.host_bits[:size], non_blocking=True)
    replay(self, size)


DecodeGraphs.upload_masks = lambda self, size: None  # type: ignore[method-assign]
DecodeGraphs.masked_argmax = in_line  # type: ignore[method-assign]
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
runpy.run_module(module, run_name="__main__")

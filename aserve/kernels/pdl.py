"""Programmatic dependent launch (PDL; Hopper and later), for the decode step's Triton kernels.

Inside a CUDA graph the device still spends a microsecond or two between two kernels: the next
one is scheduled only once the last block of the one ahead of it has finished, and then its
blocks start from nothing. A decode step of the Gemma 3 270M shape runs ~250 kernels, over a
hundred of them small Triton ones. Launched with PDL, a kernel may be scheduled while the kernel
ahead of it on its stream is still finishing; its programs then wait (``gdc_wait``, the first
thing each one does) until that kernel has completed and its writes are visible, so what it
reads and writes is ordered as without PDL, and only the launch is overlapped.

On by default on Hopper and later GPUs (compute capability 9.0+; ``griddepcontrol`` is sm_90
PTX); ``ASERVE_PDL=0`` turns it off (read at import). Measured twice (docs/benchmarks.md): a
decode graph's replay 3.0% / 1.1% shorter (Gemma 3 270M / Llama 3.2 1B shapes, 256 rows, an H100,
thirty-second session) and 3.8% / 1.0% (an H200, thirty-third session, two pairs, the runs' own
step spans no longer), the same tokens.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

ON = os.environ.get("ASERVE_PDL", "1") == "1"
_CAPABLE: dict[int, bool] = {}  # CUDA device index -> compute capability 9.0 or later


def launch_args(x: torch.Tensor) -> dict[str, bool]:
    """A launch's PDL keywords for a kernel over ``x``: its ``PDL`` constexpr, and Triton's
    ``launch_pdl`` option when on (``ASERVE_PDL`` not 0, a CUDA tensor on a Hopper or later GPU;
    Triton's interpreter takes no launch options)."""
    if not (ON and x.is_cuda):
        return {"PDL": False}
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    capable = _CAPABLE.get(index)
    if capable is None:
        capable = _CAPABLE[index] = torch.cuda.get_device_capability(index) >= (9, 0)
    return {"PDL": True, "launch_pdl": True} if capable else {"PDL": False}


@triton.jit
def wait_for_prior(PDL: tl.constexpr):
    """A PDL-launched kernel's first statement: wait for the kernel ahead of it to complete."""
    if PDL:
        gdc_wait()

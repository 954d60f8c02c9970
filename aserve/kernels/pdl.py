"""Programmatic dependent launch (PDL; Hopper and later), for the decode step's Triton kernels.

Inside a CUDA graph the device still spends a microsecond or two between two kernels: the next
one is scheduled only once the last block of the one ahead of it has finished, and then its
blocks start from nothing. A decode step of the Gemma 3 270M shape runs ~250 kernels, over a
hundred of them small Triton ones. Launched with PDL, a kernel may be scheduled while the kernel
ahead of it on its stream is still finishing; its programs then wait (``gdc_wait``, the first
thing each one does) until that kernel has completed and its writes are visible, so what it
reads and writes is ordered as without PDL, and only the launch is overlapped.

Off unless ``ASERVE_PDL=1`` (read at import). Measured once (an H100 host, docs/benchmarks.md,
thirty-second session): a decode graph's replay 3.0% shorter on the Gemma 3 270M shape and 1.1%
on Llama 3.2 1B's at 256 rows, the same tokens; but that run's own steps spanned longer on the
device (1.99 against 1.93 ms on Gemma), which one pair cannot explain. Off until measured again.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

ON = os.environ.get("ASERVE_PDL", "0") == "1"


def launch_args(x: torch.Tensor) -> dict[str, bool]:
    """A launch's PDL keywords for a kernel over ``x``: its ``PDL`` constexpr, and Triton's
    ``launch_pdl`` option when on (``ASERVE_PDL=1`` and a CUDA tensor; Triton's interpreter
    takes no launch options)."""
    return {"PDL": True, "launch_pdl": True} if ON and x.is_cuda else {"PDL": False}


@triton.jit
def wait_for_prior(PDL: tl.constexpr):
    """A PDL-launched kernel's first statement: wait for the kernel ahead of it to complete."""
    if PDL:
        gdc_wait()

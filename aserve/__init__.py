"""aserve: an LLM serving engine whose scheduler is asyncio-native and overlaps host with device.

The names below load on first use (PEP 562), so importing one module of the package (the
scheduler's policy, say) does not load the engine, torch or anyio.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from aserve.lazy import lazy_attributes

# torch's OpenMP threads (its libgomp reads OMP_WAIT_POLICY once, when torch is imported, so
# this runs before aserve imports torch): PASSIVE makes a thread waiting for work sleep rather
# than spin for ~3 ms. On a machine whose cores other processes share, spinning threads held
# up every parallel region (a decode step of 83 ms took 1.5 s); docs/architecture.md, "CPU
# weights". Set OMP_WAIT_POLICY yourself to keep another policy. Where torch was imported
# before aserve, its policy is already fixed and this changes nothing (the engine logs it).
TORCH_IMPORTED_FIRST = "torch" in sys.modules
# Whether the line below set it (a benchmark starts its peers without it: llama_peer.py).
OMP_WAIT_POLICY_SET_HERE = not TORCH_IMPORTED_FIRST and "OMP_WAIT_POLICY" not in os.environ
if OMP_WAIT_POLICY_SET_HERE:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

if TYPE_CHECKING:
    from aserve.config import EngineConfig
    from aserve.engine import Engine, RequestStream
    from aserve.errors import (
        AserveError,
        ContextLengthError,
        EngineClosedError,
        EngineFailedError,
        EngineOverloadedError,
        InvalidRequestError,
        KVAllocationError,
        KVCapacityError,
        ModelLoadError,
        ModelNotFoundError,
        RequestAbortedError,
    )
    from aserve.outputs import CompletionOutput, CompletionResult, Delta, TokenLogprob, Usage
    from aserve.sampling_params import SamplingParams, StructuredOutputs

__version__ = "0.1.0"

_HOME = {
    "EngineConfig": "aserve.config",
    "Engine": "aserve.engine",
    "RequestStream": "aserve.engine",
    "SamplingParams": "aserve.sampling_params",
    "StructuredOutputs": "aserve.sampling_params",
    **dict.fromkeys(("CompletionOutput", "CompletionResult", "Delta", "TokenLogprob", "Usage"), "aserve.outputs"),
    **dict.fromkeys(
        (
            "AserveError",
            "ContextLengthError",
            "EngineClosedError",
            "EngineFailedError",
            "EngineOverloadedError",
            "InvalidRequestError",
            "KVAllocationError",
            "KVCapacityError",
            "ModelLoadError",
            "ModelNotFoundError",
            "RequestAbortedError",
        ),
        "aserve.errors",
    ),
}

__all__ = [
    "AserveError",
    "CompletionOutput",
    "CompletionResult",
    "ContextLengthError",
    "Delta",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "EngineFailedError",
    "EngineOverloadedError",
    "InvalidRequestError",
    "KVAllocationError",
    "KVCapacityError",
    "ModelLoadError",
    "ModelNotFoundError",
    "RequestAbortedError",
    "RequestStream",
    "SamplingParams",
    "StructuredOutputs",
    "TokenLogprob",
    "Usage",
    "__version__",
]


__getattr__, __dir__ = lazy_attributes("aserve", globals(), _HOME)

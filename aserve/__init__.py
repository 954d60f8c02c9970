"""aserve: an LLM serving engine whose scheduler is asyncio-native and overlaps host with device.

The names below load on first use (PEP 562), so importing one module of the package (the
scheduler's policy, say) does not load the engine, torch or anyio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aserve.config import EngineConfig
    from aserve.engine import Engine, RequestStream
    from aserve.errors import (
        AserveError,
        ContextLengthError,
        EngineClosedError,
        EngineOverloadedError,
        InvalidRequestError,
        KVCapacityError,
        ModelLoadError,
        ModelNotFoundError,
        RequestAbortedError,
    )
    from aserve.outputs import CompletionOutput, CompletionResult, Delta, TokenLogprob, Usage
    from aserve.sampling_params import SamplingParams

__version__ = "0.1.0"

_HOME = {
    "EngineConfig": "aserve.config",
    "Engine": "aserve.engine",
    "RequestStream": "aserve.engine",
    "SamplingParams": "aserve.sampling_params",
    **dict.fromkeys(("CompletionOutput", "CompletionResult", "Delta", "TokenLogprob", "Usage"), "aserve.outputs"),
    **dict.fromkeys(
        (
            "AserveError",
            "ContextLengthError",
            "EngineClosedError",
            "EngineOverloadedError",
            "InvalidRequestError",
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
    "EngineOverloadedError",
    "InvalidRequestError",
    "KVCapacityError",
    "ModelLoadError",
    "ModelNotFoundError",
    "RequestAbortedError",
    "RequestStream",
    "SamplingParams",
    "TokenLogprob",
    "Usage",
    "__version__",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'aserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])

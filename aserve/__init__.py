"""aserve: an LLM serving engine whose scheduler is asyncio-native and overlaps host with device."""

from __future__ import annotations

from aserve.config import EngineConfig
from aserve.engine import Engine
from aserve.errors import (
    AserveError,
    ContextLengthError,
    EngineClosedError,
    EngineOverloadedError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    RequestAbortedError,
)
from aserve.outputs import CompletionOutput, CompletionResult, Delta, TokenLogprob, Usage
from aserve.sampling_params import SamplingParams

__version__ = "0.1.0"

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
    "ModelLoadError",
    "ModelNotFoundError",
    "RequestAbortedError",
    "SamplingParams",
    "TokenLogprob",
    "Usage",
    "__version__",
]

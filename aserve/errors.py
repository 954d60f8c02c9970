"""Typed errors a user can cause, and the faults a request can end with. Each message says
what to change.

Internal invariants use ``assert`` with the values in the message; these classes are for
input (requests, model paths, files), which map to HTTP 4xx statuses in the server, and for
engine faults a caller must be told about (503: retry, or restart the engine).
"""

from __future__ import annotations


class AserveError(Exception):
    """Base of every error aserve raises on purpose."""

    status_code: int = 500
    error_type: str = "internal_error"


class InvalidRequestError(AserveError, ValueError):
    """A request (prompt or sampling parameters) is malformed; ``param`` names the field."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(InvalidRequestError):
    """The prompt (plus requested output) does not fit the model's context."""


class KVCapacityError(ContextLengthError):
    """The request's context outgrew a KV pool that cannot hold it even alone (it made no
    further progress); it ends with this error instead of a truncated "length" finish."""

    error_type = "kv_capacity_exceeded"


class ModelNotFoundError(AserveError, FileNotFoundError):
    """A model name or path resolves to nothing loadable."""

    status_code = 404
    error_type = "not_found_error"


class ModelLoadError(AserveError):
    """A model file exists but cannot be read (truncated, unsupported architecture, ...)."""

    status_code = 500
    error_type = "model_load_error"


class EngineOverloadedError(AserveError):
    """The waiting queue is full; retry later."""

    status_code = 429
    error_type = "overloaded_error"


class EngineClosedError(AserveError):
    """The engine is shutting down or not started; no new requests are admitted."""

    status_code = 503
    error_type = "engine_closed"


class EngineFailedError(EngineClosedError):
    """The engine stopped after a fault it cannot recover from: work on the device raised, a
    step never completed (``watchdog_timeout``), or the step loop itself raised. Every request
    in flight ends with it and new ones are refused; restart the engine (or the server)."""

    error_type = "engine_failed"


class RequestAbortedError(AserveError):
    """The request was aborted (engine shutdown, or a fault that ended it) before it finished."""

    status_code = 503
    error_type = "request_aborted"


class KVAllocationError(RequestAbortedError):
    """KV memory could not be allocated for the request when it was planned (the allocator
    raised); that request ends with this error, the others run on. Retrying may succeed."""

    error_type = "kv_allocation_failed"

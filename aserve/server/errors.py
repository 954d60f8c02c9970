"""OpenAI-style error bodies, and the mapping from every exception a request can raise.

A client must never see a 500 for something it sent: engine errors carry their own status,
pydantic errors become 422 naming the field, and malformed bodies become 400 or 413.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from aserve.errors import AserveError, EngineClosedError, EngineOverloadedError
from aserve.logs import get_logger

log = get_logger("aserve.server")

# How long a client should back off when the queue is full or the server is starting/draining.
RETRY_AFTER_S = "1"


class APIError(Exception):
    """An error the HTTP layer raises itself (auth, body size, unknown model, ...)."""

    def __init__(
        self,
        status_code: int,
        message: str,
        error_type: str,
        *,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.error_type = error_type
        self.param = param
        self.headers = dict(headers or {})


def error_body(status_code: int, message: str, error_type: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": status_code}}


def error_response(
    status_code: int,
    message: str,
    error_type: str,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status_code, message, error_type, param), status_code, headers=headers)


def from_aserve(exc: AserveError) -> APIError:
    headers = {}
    if isinstance(exc, (EngineOverloadedError, EngineClosedError)):
        headers["Retry-After"] = RETRY_AFTER_S
    # A status outside 4xx/503 from the engine is a server fault, reported honestly as such.
    return APIError(exc.status_code, str(exc), exc.error_type, param=getattr(exc, "param", None), headers=headers)


def from_validation(exc: ValidationError) -> APIError:
    first = exc.errors(include_url=False)[0] if exc.error_count() else None
    if first is None:
        return APIError(422, "request body is invalid", "invalid_request_error")
    param = ".".join(str(p) for p in first["loc"]) or None
    more = f" (and {exc.error_count() - 1} more errors)" if exc.error_count() > 1 else ""
    where = f"{param}: " if param else ""
    return APIError(422, f"{where}{first['msg']}{more}", "invalid_request_error", param=param)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError), exc
    return error_response(exc.status_code, exc.message, exc.error_type, exc.param, exc.headers)


async def _aserve_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, AserveError), exc
    return await _api_error(request, from_aserve(exc))


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ValidationError), exc
    return await _api_error(request, from_validation(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    # Starlette's own 404/405 for unknown routes and methods, in the same JSON shape.
    assert isinstance(exc, HTTPException), exc
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(exc.status_code, str(exc.detail), kind, headers=exc.headers)


async def _client_gone(request: Request, exc: Exception) -> Response:
    # The client hung up while sending its body: nothing of ours failed, no traceback to log.
    # 499 only makes the request's one log line say so; Hypercorn sends nothing, the connection being gone.
    assert isinstance(exc, ClientDisconnect), exc
    return Response(status_code=499)


async def _unexpected(request: Request, exc: Exception) -> Response:
    # A bug on our side: keep the traceback in the log, give the client the same JSON shape.
    log.exception("unhandled_error", path=request.url.path)
    return error_response(500, "internal server error", "internal_error")


def exception_handlers() -> dict[Any, Any]:
    return {
        APIError: _api_error,
        AserveError: _aserve_error,
        ValidationError: _validation_error,
        HTTPException: _http_error,
        ClientDisconnect: _client_gone,
        Exception: _unexpected,
    }

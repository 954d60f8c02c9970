"""The OpenAPI 3.1 document, generated from the pydantic models so it cannot drift from them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from aserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from aserve.server.responses import (
    ChatCompletionResponse,
    CompletionResponse,
    DetokenizeResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
)

_REF = "#/components/schemas/{model}"


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _errors(*codes: int) -> dict[str, Any]:
    content = {"application/json": {"schema": _ref(ErrorResponse)}}
    return {str(c): {"description": "error", "content": content} for c in codes}


def _generate_op(summary: str, request: type[BaseModel], response: type[BaseModel]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {
                "200": {
                    "description": "the completion, or an SSE stream of chunks when `stream` is true",
                    "content": {
                        "application/json": {"schema": _ref(response)},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **_errors(400, 401, 404, 413, 422, 429, 503),
            },
        }
    }


def _json_op(summary: str, request: dict[str, Any], response: type[BaseModel]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {
                "200": {"description": "ok", "content": {"application/json": {"schema": _ref(response)}}},
                **_errors(400, 401, 404, 413, 422, 503),
            },
        }
    }


def openapi_document(title: str, version: str, *, bearer_auth: bool) -> dict[str, Any]:
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (CompletionRequest, "validation"),
        (ChatCompletionRequest, "validation"),
        (CompletionResponse, "serialization"),
        (ChatCompletionResponse, "serialization"),
        (ModelList, "serialization"),
        (ErrorResponse, "serialization"),
        (TokenizeCompletionRequest, "validation"),
        (TokenizeChatRequest, "validation"),
        (TokenizeResponse, "serialization"),
        (DetokenizeRequest, "validation"),
        (DetokenizeResponse, "serialization"),
    ]
    _, defs = models_json_schema(models, ref_template=_REF)
    plain = {"200": {"description": "ok"}}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": {
            "/v1/completions": _generate_op("Create a completion", CompletionRequest, CompletionResponse),
            "/v1/chat/completions": _generate_op(
                "Create a chat completion", ChatCompletionRequest, ChatCompletionResponse
            ),
            "/v1/models": {
                "get": {
                    "summary": "List the served model",
                    "responses": {
                        "200": {"description": "ok", "content": {"application/json": {"schema": _ref(ModelList)}}},
                        **_errors(401),
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "The served model's card",
                    "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": {"description": "ok", "content": {"application/json": {"schema": _ref(ModelCard)}}},
                        **_errors(401, 404),
                    },
                }
            },
            "/health": {
                "get": {
                    "summary": "200 once the model is loaded and warmed up",
                    "responses": {
                        **plain,
                        "503": {
                            "description": "loading, shutting down, or the engine failed "
                            '(`{"status": "failed", "type": "engine_failed", ...}`)'
                        },
                    },
                }
            },
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": plain}},
            "/openapi.json": {"get": {"summary": "This document", "responses": plain}},
            "/admin/flush_cache": {
                "post": {
                    "summary": "Drop the prefix cache (only while no request runs)",
                    "responses": {
                        "200": {
                            "description": "the tokens freed",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {"flushed_tokens": {"type": "integer"}},
                                        "required": ["flushed_tokens"],
                                    }
                                }
                            },
                        },
                        **_errors(401, 409, 503),
                    },
                }
            },
            "/tokenize": _json_op(
                "Token ids of a text or of chat messages (vLLM's shapes)",
                {"oneOf": [_ref(TokenizeCompletionRequest), _ref(TokenizeChatRequest)]},
                TokenizeResponse,
            ),
            "/detokenize": _json_op("Text of token ids (vLLM's shapes)", _ref(DetokenizeRequest), DetokenizeResponse),
        },
        "components": {"schemas": defs.get("$defs", {})},
    }
    if bearer_auth:
        doc["components"]["securitySchemes"] = {"bearerAuth": {"type": "http", "scheme": "bearer"}}
        for path, ops in doc["paths"].items():
            if path.startswith(("/v1/", "/admin/")) or path in ("/tokenize", "/detokenize"):
                for op in ops.values():
                    op["security"] = [{"bearerAuth": []}]
    return doc

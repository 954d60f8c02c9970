"""The OpenAPI document lists every route of the app, with each of its methods."""

from __future__ import annotations

import re

from starlette.routing import Route

from aserve.config import EngineConfig
from aserve.server.app import create_app
from aserve.server.openapi import openapi_document


def test_every_route_is_in_the_document() -> None:
    app = create_app(EngineConfig())
    doc = openapi_document("aserve", "0", bearer_auth=True)
    routes = [r for r in app.routes if isinstance(r, Route)]
    assert routes

    def documented(path: str) -> str:  # OpenAPI writes a parameter without Starlette's converter
        return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)

    for route in routes:
        path = documented(route.path)
        assert path in doc["paths"], route.path
        methods = {m.lower() for m in route.methods or ()} - {"head"}
        assert methods <= set(doc["paths"][path]), (route.path, methods)
    assert set(doc["paths"]) == {documented(r.path) for r in routes}
    # Every route behind the API key says so.
    for path in ("/v1/completions", "/admin/flush_cache", "/tokenize", "/detokenize"):
        for op in doc["paths"][path].values():
            assert op["security"] == [{"bearerAuth": []}], path

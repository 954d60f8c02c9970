"""Fixtures the server test modules share; each module brings its own ``server`` fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.server.helpers import API_KEY, ServerProcess


@pytest.fixture(scope="module")
def tokenizer(default_gguf: Path) -> Any:
    """The default model's tokenizer, the reference for what the server renders."""
    from aserve.tokenizer.tokenizer import tokenizer_from_gguf

    return tokenizer_from_gguf(default_gguf)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    """The official OpenAI client against the module's server."""
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)

"""A KV pool smaller than the model's context: the server says so and refuses what cannot fit.

With a 960-token pool, a 900-token prompt with ``max_tokens`` 200 used to come back as 60
tokens and ``finish_reason=length`` while ``/v1/models`` advertised 8192 tokens."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.server.helpers import API_KEY, ServerProcess, running_server

# The default model on a CPU (float32): 18 layers x 1 KV head x 256 x (K + V) x 4 bytes.
BYTES_PER_TOKEN = 18 * 256 * 2 * 4
POOL_TOKENS = 960


@pytest.fixture(scope="module", params=["0", "2"], ids=["one-process", "api-workers-2"])
def small_pool_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """Both shapes: with front ends, they learn the pool's size from the core."""
    with running_server("--kv-cache-bytes", str(POOL_TOKENS * BYTES_PER_TOKEN), "--api-workers", request.param,
                        log_dir=tmp_path_factory.mktemp("srv")) as srv:  # fmt: skip
        yield srv


def test_small_pool_is_advertised_and_enforced(small_pool_server: ServerProcess) -> None:
    srv = small_pool_server
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=srv.base_url, headers=headers, timeout=120) as http:
        models = http.get("/v1/models").json()["data"]
        assert models[0]["max_model_len"] == POOL_TOKENS
        prompt = [2] + [1000 + i for i in range(899)]  # 900 token ids
        r = http.post("/v1/completions", json={"model": models[0]["id"], "prompt": prompt, "max_tokens": 200})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "max_tokens"
        r = http.post("/v1/completions", json={"model": models[0]["id"], "prompt": prompt, "max_tokens": 60,
                                               "ignore_eos": True})  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 60
    assert "kv_pool_smaller_than_context" in srv.log_tail(200_000)

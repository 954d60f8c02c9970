"""The Ray Serve application on this CPU: a local Ray cluster, two replicas of the default model.

One module-scoped cluster (Ray's start and two model loads are most of the cost), small KV
pools and few tokens. Skipped where Ray is not installed (``pip install aserve[ray]``).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from aserve.config import EngineConfig  # noqa: E402
from aserve.ray.app import application  # noqa: E402
from aserve.ray.options import RayOptions  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
# 32 MiB of KV: ~900 tokens a replica, plenty for the 4 shared prefixes and a few requests.
CONFIG = EngineConfig(kv_cache_bytes=32 * 2**20, warmup=False, max_running_requests=16, num_threads=1)
WAIT_S = 240.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _deploy(routing: str) -> None:
    serve.run(application(CONFIG, RayOptions(replicas=2, routing=routing)), name="aserve", route_prefix="/")


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        _deploy("prefix")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _metrics(url: str) -> dict[str, float]:
    return _samples(httpx.get(f"{url}/metrics", timeout=60).text)


def _wait_for(check, what: str, timeout_s: float = WAIT_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_openai_client_streams_through_the_ingress(base_url: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=120)
    whole = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    stream = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
    )
    pieces = [c.choices[0].text for c in stream if c.choices]
    assert len(pieces) > 1, "streamed as one chunk"
    assert "".join(pieces) == whole.choices[0].text
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(chat)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    # The replica's own error bodies come through unchanged.
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)


def _loadgen_hit_rate(tmp: Path, label: str, target: list[str]) -> float:
    cmd = [
        sys.executable, "-m", "loadgen", "run", *target, "--workload", "shared-prefix", "--groups", "4",
        "--per-group", "8", "--output-len", "4", "--max-concurrency", "4", "--no-plots", "--no-progress",
        "--out", str(tmp), "--label", label,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=600, capture_output=True)
    summary = json.loads((tmp / f"{label}.json").read_text())
    assert summary["requests"]["completed"] == 32, summary["requests"]
    return float(summary["server"]["cache_hit_rate"])


def test_prefix_routing_keeps_a_single_engines_hit_rate(base_url: str, tmp_path: Path) -> None:
    http = ["--base-url", base_url]
    assert httpx.post(f"{base_url}/admin/flush_cache", timeout=60).status_code == 200
    prefix = _loadgen_hit_rate(tmp_path, "prefix", http)
    _deploy("round-robin")  # only the ingress changes: the replicas keep their engines
    try:
        assert httpx.post(f"{base_url}/admin/flush_cache", timeout=60).status_code == 200
        round_robin = _loadgen_hit_rate(tmp_path, "round_robin", http)
    finally:
        _deploy("prefix")
    engine = ["--engine", "--engine-opt", f"kv_cache_bytes={CONFIG.kv_cache_bytes}",
              "--engine-opt", "warmup=false", "--engine-opt", "max_running_requests=16"]  # fmt: skip
    single = _loadgen_hit_rate(tmp_path, "single", engine)
    print(f"hit rate: single engine {single:.3f}, prefix-aware {prefix:.3f}, round-robin {round_robin:.3f}")
    assert abs(prefix - single) <= 0.10 * single, (prefix, single)
    assert round_robin <= 0.60, round_robin


def _stream_replica(client: httpx.Client, prompt: str, max_tokens: int) -> tuple[httpx.Response, str]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    resp = client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
    assert resp.status_code == 200
    return resp, resp.headers["x-aserve-replica"]


def test_client_disconnect_aborts_on_the_replica(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        before = _metrics(base_url)
        resp, replica = _stream_replica(client, "A long story about a lighthouse keeper:", 400)
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        resp.close()  # the client leaves after its first chunk
    label = f'aserve_requests_total{{endpoint="completions",outcome="abort",replica="{replica}"}}'

    def aborted() -> dict[str, float] | None:
        m = _metrics(base_url)
        on = f'{{replica="{replica}"}}'
        done = (
            m.get(label, 0) > before.get(label, 0)
            and m[f"aserve_requests_running{on}"] == 0
            # Its KV went back: what is still in use is what the prefix cache holds.
            and m[f"aserve_kv_used_tokens{on}"] == m[f"aserve_prefix_cached_tokens{on}"]
        )
        return m if done else None

    _wait_for(aborted, "the replica to abort the request and free its KV", timeout_s=60)


def _replica_actor(replica: str):  # type: ignore[no-untyped-def]
    for a in ray.util.list_named_actors(all_namespaces=True):
        if "AserveReplica" in a["name"] and a["name"].endswith(replica):
            return ray.get_actor(a["name"], namespace=a["namespace"])
    raise AssertionError(f"no actor for replica {replica}")


def test_a_dead_replica_fails_only_its_requests(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=180) as client:
        streams = [_stream_replica(client, f"Story number {k} begins with a", 96) for k in range(4)]
        replicas = {r for _, r in streams}
        assert len(replicas) == 2, f"4 unrelated prompts went to {replicas}"
        iters = [resp.iter_lines() for resp, _ in streams]
        for it in iters:  # every stream is running
            next(line for line in it if line.startswith("data: "))
        victim = streams[0][1]
        ray.kill(_replica_actor(victim), no_restart=True)
        for (resp, replica), it in zip(streams, iters):
            events = [line.removeprefix("data: ") for line in it if line.startswith("data: ")]
            resp.close()
            assert events[-1] == "[DONE]"
            last = json.loads(events[-2])
            if replica == victim:
                assert last["error"]["type"] == "replica_failed", last
            else:
                assert "error" not in last and last["choices"][0]["finish_reason"] == "length", last

    # Serve replaces it; the application serves from both again.
    _wait_for(lambda: _metrics(base_url).get("aserve_replicas") == 2, "a replacement replica")
    r = httpx.post(f"{base_url}/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 2}, timeout=120)
    assert r.status_code == 200 and r.headers["x-aserve-replica"]
    assert re.fullmatch(r"\w+", r.headers["x-aserve-replica"])

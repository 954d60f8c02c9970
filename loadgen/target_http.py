"""The HTTP target: any OpenAI-compatible server, streamed over SSE with one shared client."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import httpx

from loadgen.records import RequestRecord
from loadgen.server_view import parse_prometheus
from loadgen.workloads import TokenizerLike, WorkItem

Clock = Callable[[], float]


class HttpTarget:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        endpoint: str = "completions",
        api_key: str | None = None,
        tokenizer: TokenizerLike | None = None,
        ignore_eos: bool = True,
        request_timeout: float = 600.0,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.endpoint = endpoint
        self.tokenizer = tokenizer
        self.ignore_eos = ignore_eos
        self.request_timeout = request_timeout
        self.extra_body = extra_body or {}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One client for the whole run: connection reuse is part of what a real client does,
        # and no limit on connections so the client never queues requests the schedule sent.
        self.client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(request_timeout, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def wait_ready(self, limit_s: float) -> None:
        """Poll ``/health`` until it answers 200; ``/v1/models`` only where there is no ``/health``.

        A loading aserve answers 503 on /health but 200 on /v1/models, so the fallback must not
        be taken merely because /health is not ready yet.
        """
        last = "no answer"
        with anyio.move_on_after(limit_s):
            while True:
                try:
                    r = await self.client.get(self.base_url + "/health", timeout=5.0)
                    if r.status_code == 404:
                        r = await self.client.get(self.base_url + "/v1/models", timeout=5.0)
                    if r.status_code == 200:
                        return
                    last = f"{r.url.path}: HTTP {r.status_code}"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                await anyio.sleep(0.25)
        raise TimeoutError(f"{self.base_url} not ready after {limit_s:g}s ({last})")

    async def served_model(self) -> str:
        """The first model id the server lists at ``/v1/models``."""
        url = self.base_url + "/v1/models"
        r = await self.client.get(url, timeout=10.0)
        if r.status_code != 200:
            raise ValueError(f"{url} answered HTTP {r.status_code}; pass --model NAME")
        data = r.json().get("data") or []
        if not data or not isinstance(data[0], dict) or not data[0].get("id"):
            raise ValueError(f"{url} lists no model; pass --model NAME")
        return str(data[0]["id"])

    async def server_counters(self) -> dict[str, float] | None:
        try:
            r = await self.client.get(self.base_url + "/metrics", timeout=10.0)
        except httpx.HTTPError:
            return None
        return parse_prometheus(r.text) if r.status_code == 200 else None

    def _body(self, item: WorkItem) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": item.max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": self.ignore_eos,
        }
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": self._text(item)}]
        else:
            body["prompt"] = item.prompt_ids if item.prompt_ids is not None else item.prompt_text
        body.update(self.extra_body)
        return body

    def _text(self, item: WorkItem) -> str:
        if item.prompt_text is not None:
            return item.prompt_text
        assert self.tokenizer is not None and item.prompt_ids is not None, "chat needs a tokenizer for id prompts"
        return self.tokenizer.decode(item.prompt_ids)

    async def send(self, item: WorkItem, rec: RequestRecord, now: Clock) -> None:
        path = "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"
        body = self._body(item)
        try:
            with anyio.fail_after(self.request_timeout):
                rec.send_s = now()
                async with self.client.stream("POST", self.base_url + path, json=body) as resp:
                    rec.status = resp.status_code
                    if resp.status_code != 200:
                        text = (await resp.aread()).decode(errors="replace")
                        rec.fail("HTTPStatus", text, now(), resp.status_code)
                        return
                    await self._read_stream(resp, rec, now)
        except TimeoutError:
            rec.fail("Timeout", f"no end of stream after {self.request_timeout:g}s", now())
        except httpx.HTTPError as exc:
            rec.fail(type(exc).__name__, str(exc) or repr(exc), now())
        except Exception as exc:  # a malformed answer must not end the run
            rec.fail(type(exc).__name__, str(exc), now())

    async def _read_stream(self, resp: httpx.Response, rec: RequestRecord, now: Clock) -> None:
        async for line in resp.aiter_lines():
            t = now()  # stamp before parsing so JSON work is not counted as latency
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                if rec.error_type is None:  # an in-band error already ended it
                    rec.done_s = t
                    rec.finished = True
                return
            obj = json.loads(data)
            if "error" in obj:  # in-band error after the headers went out
                err = obj["error"]
                msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
                rec.fail("StreamError", msg, t)
                continue
            if obj.get("usage"):
                rec.usage_prompt_tokens = obj["usage"].get("prompt_tokens")
                rec.usage_completion_tokens = obj["usage"].get("completion_tokens")
            for choice in obj.get("choices") or []:
                n = self._count(choice, rec)
                if n > 0:
                    rec.chunk_s.append(t)
                    rec.chunk_tokens.append(n)
        if rec.error_type is None:
            rec.fail("IncompleteStream", "the stream ended before data: [DONE]", now())

    def _count(self, choice: dict[str, Any], rec: RequestRecord) -> int:
        """Tokens in one chunk: token ids if sent, else logprobs, else our tokenizer, else 1."""
        if isinstance(choice.get("token_ids"), list):
            rec.count_source = "token_ids"
            return len(choice["token_ids"])
        lp = choice.get("logprobs")
        if isinstance(lp, dict):
            seq: Sequence[Any] | None = lp.get("tokens") or lp.get("content")
            if seq:
                rec.count_source = "logprobs"
                return len(seq)
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content")
        if not text:
            return 0
        if self.tokenizer is not None:
            rec.count_source = "tokenizer"
            return max(1, len(self.tokenizer.encode(text)))
        return 1

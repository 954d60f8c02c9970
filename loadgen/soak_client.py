"""One soak request: a draw from the mix (endpoint, streaming, lengths, abort plan), sent and judged.

A planned abort closes the connection: a stream after its k-th content chunk (leaving the
``httpx`` stream context before the body ends closes the socket), a non-streamed request after
a delay, by cancelling the call. Aborts are the point of the exercise, not errors; errors are
non-2xx answers, in-band stream errors, streams that end without ``[DONE]``, answers of the
wrong length (with ``ignore_eos``), transport errors and timeouts.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from loadgen.workloads import TokenizerLike, WorkItem

Clock = Callable[[], float]
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class MixSpec:
    endpoints: tuple[str, ...] = ("completions", "chat")
    stream_fraction: float = 0.75  # the rest are plain JSON answers
    abort_rate: float = 0.1  # share of requests the client hangs up on
    ignore_eos: bool = True  # every answer then has exactly max_tokens tokens, which is checked


@dataclass(frozen=True)
class Plan:
    item: WorkItem
    endpoint: str
    stream: bool
    abort_after_chunks: int | None = None  # streamed: hang up after this many content chunks
    abort_after_s: float | None = None  # not streamed: hang up after this long


@dataclass(slots=True)
class Outcome:
    """What became of one request; times on the soak's clock (seconds)."""

    endpoint: str
    stream: bool
    send_s: float
    end_s: float = 0.0
    kind: str = "ok"  # ok, aborted, error
    first_token_s: float | None = None  # streamed only: the first chunk with content
    output_tokens: int = 0
    abort_planned: bool = False
    error_type: str | None = None
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.send_s

    @property
    def e2e(self) -> float:
        return self.end_s - self.send_s

    def fail(self, error_type: str, message: str, now: float) -> None:
        self.kind, self.error_type, self.error, self.end_s = "error", error_type, message[:300], now


class Mixer:
    """Draws plans from a fixed pool of prompts; seeded, so a soak can be repeated."""

    def __init__(self, items: Sequence[WorkItem], mix: MixSpec, seed: int) -> None:
        assert items, "the soak needs at least one prompt"
        self.items, self.mix = list(items), mix
        self.rng = random.Random(seed)
        self.plain_e2e = 1.0  # running estimate of a non-streamed answer's time, to time its aborts

    def draw(self) -> Plan:
        rng, mix = self.rng, self.mix
        item = rng.choice(self.items)
        endpoint = rng.choice(mix.endpoints)
        stream = rng.random() < mix.stream_fraction
        if rng.random() >= mix.abort_rate:
            return Plan(item, endpoint, stream)
        if stream:  # after 1 .. half the answer's chunks: mid-stream, well before its end
            return Plan(item, endpoint, stream, abort_after_chunks=rng.randint(1, max(1, item.max_tokens // 2)))
        return Plan(item, endpoint, stream, abort_after_s=rng.uniform(0.05, 0.9) * self.plain_e2e)

    def observe(self, out: Outcome) -> None:
        if out.kind == "ok" and not out.stream:
            self.plain_e2e = 0.9 * self.plain_e2e + 0.1 * out.e2e


class SoakClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: TokenizerLike,
        *,
        api_key: str | None,
        ignore_eos: bool,
        request_timeout: float,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model, self.tokenizer = model, tokenizer
        self.ignore_eos, self.request_timeout = ignore_eos, request_timeout
        self.client = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
            timeout=httpx.Timeout(request_timeout, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def aclose(self) -> None:
        """Closes every pooled connection, so the server's side of them closes too."""
        await self.client.aclose()

    def body(self, plan: Plan) -> dict[str, Any]:
        it = plan.item
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": it.max_tokens,
            "temperature": 0.0,
            "stream": plan.stream,
            "ignore_eos": self.ignore_eos,
        }
        if plan.stream:
            body["stream_options"] = {"include_usage": True}
        if plan.endpoint == "chat":
            text = it.prompt_text if it.prompt_text is not None else self.tokenizer.decode(it.prompt_ids or [])
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = it.prompt_ids if it.prompt_ids is not None else it.prompt_text
        return body

    async def send(self, plan: Plan, now: Clock) -> Outcome:
        """Sends one request and returns its outcome; never raises for what the server does.

        Cancelling it closes the connection, which is also how a planned abort is made.
        """
        out = Outcome(plan.endpoint, plan.stream, now(), abort_planned=plan.abort_after_chunks is not None)
        url = self.base_url + ENDPOINTS[plan.endpoint]
        try:
            with anyio.fail_after(self.request_timeout):
                if plan.stream:
                    await self._streamed(url, plan, out, now)
                else:
                    await self._plain(url, plan, out, now)
        except TimeoutError:
            out.fail("Timeout", f"no answer after {self.request_timeout:g}s", now())
        except httpx.HTTPError as exc:
            out.fail(type(exc).__name__, str(exc) or repr(exc), now())
        except (ValueError, KeyError, TypeError) as exc:  # a malformed answer
            out.fail("BadAnswer", f"{type(exc).__name__}: {exc}", now())
        return out

    async def _plain(self, url: str, plan: Plan, out: Outcome, now: Clock) -> None:
        with anyio.move_on_after(plan.abort_after_s) as hang_up:
            resp = await self.client.post(url, json=self.body(plan))
        if hang_up.cancelled_caught:
            out.kind, out.abort_planned, out.end_s = "aborted", True, now()
            return
        out.abort_planned = plan.abort_after_s is not None  # planned, but the answer came first
        if resp.status_code != 200:
            out.fail(f"HTTP{resp.status_code}", resp.text, now())
            return
        data = resp.json()
        choice = data["choices"][0]
        text = choice["text"] if plan.endpoint == "completions" else choice["message"]["content"]
        if not isinstance(text, str):
            raise TypeError(f"answer text is {type(text).__name__}")
        out.output_tokens = int(data["usage"]["completion_tokens"])
        out.end_s = now()
        self._check_length(plan, out)

    async def _streamed(self, url: str, plan: Plan, out: Outcome, now: Clock) -> None:
        chunks = 0
        async with self.client.stream("POST", url, json=self.body(plan)) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                out.fail(f"HTTP{resp.status_code}", text, now())
                return
            async for line in resp.aiter_lines():
                t = now()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    out.end_s = t
                    self._check_length(plan, out)
                    return
                obj = json.loads(data)
                if "error" in obj:
                    err = obj["error"]
                    out.fail("StreamError", err.get("message", str(err)) if isinstance(err, dict) else str(err), t)
                    return
                if obj.get("usage"):
                    out.output_tokens = int(obj["usage"]["completion_tokens"])
                if any(_content(c) for c in obj.get("choices") or ()):
                    chunks += 1
                    if out.first_token_s is None:
                        out.first_token_s = t
                    if plan.abort_after_chunks is not None and chunks >= plan.abort_after_chunks:
                        out.kind, out.end_s = "aborted", t
                        return  # leaving the stream context closes the connection mid-body
        out.fail("IncompleteStream", f"the stream ended before data: [DONE] after {chunks} chunks", now())

    def _check_length(self, plan: Plan, out: Outcome) -> None:
        if self.ignore_eos and out.output_tokens != plan.item.max_tokens:
            out.fail("WrongLength", f"{out.output_tokens} tokens, asked for {plan.item.max_tokens}", out.end_s)


def _content(choice: dict[str, Any]) -> bool:
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content")
    return bool(text) or bool(choice.get("token_ids"))

"""Prompt blocks and the router's approximate prefix index.

A prompt becomes a chain of block hashes: block *i*'s hash covers every token (or character)
up to the end of block *i*, as vLLM's block hashes do, so two prompts share their first *k*
hashes exactly when they share their first *k* blocks. Token ids are cut into blocks of the
engine's page size (what its radix cache can reuse); text (a prompt not yet tokenized, chat
messages) into blocks of ``4 × block_tokens`` characters, about as many tokens.

The index is the router's guess of each replica's prefix cache, as SGLang's router keeps an
approximate tree: blocks are recorded when a request is routed, and each replica's entries
are bounded by its KV capacity and dropped least recently used first. It is never told what
a replica really evicted; a wrong guess costs one cache miss, never a wrong answer.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CHARS_PER_TOKEN = 4  # how text blocks are sized against token blocks


def block_hashes(prompt: str | Sequence[int], block_tokens: int) -> list[int]:
    """The chained hashes of the prompt's whole blocks (a partial last block is left out)."""
    if isinstance(prompt, str):
        size = block_tokens * CHARS_PER_TOKEN
        data = prompt.encode("utf-8", "surrogatepass")
        kind = b"t"
    else:
        size = block_tokens * 4  # int32 ids
        data = array("i", prompt).tobytes()
        kind = b"i"
    out: list[int] = []
    prev = kind
    for start in range(0, len(data) - len(data) % size, size):
        digest = hashlib.blake2b(prev + data[start : start + size], digest_size=8).digest()
        out.append(int.from_bytes(digest, "little"))
        prev = digest
    return out


def _message_text(messages: Sequence[Any]) -> str:
    parts = []
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        parts.append(f"{m.get('role', '')}\n{content if content is not None else ''}\n")
    return "".join(parts)


def route_prompt(body: Any) -> str | list[int] | None:
    """What a request body's prompt is, for routing: the completion prompt (the first one of
    a list), chat messages as text, or None when there is none (the replica then validates)."""
    if not isinstance(body, Mapping):
        return None
    messages = body.get("messages")
    if isinstance(messages, list):
        return _message_text(messages)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int) and all(isinstance(t, int) for t in prompt):
            return [int(t) for t in prompt]
        if isinstance(first, str):
            return first
        if isinstance(first, list) and all(isinstance(t, int) for t in first):
            return [int(t) for t in first]
    return None


class PrefixIndex:
    """Which replicas probably hold which blocks: one LRU of block hashes per replica."""

    def __init__(self, default_capacity_blocks: int = 1 << 20) -> None:
        self.default_capacity_blocks = default_capacity_blocks
        self._holders: dict[int, set[str]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}

    def size(self, replica: str) -> int:
        """Blocks recorded for ``replica``."""
        lru = self._lru.get(replica)
        return len(lru) if lru is not None else 0

    def set_capacity(self, replica: str, blocks: int) -> None:
        self._capacity[replica] = max(1, blocks)
        self._evict(replica)

    def match(self, blocks: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """For each of ``replicas`` holding at least the first block: how many leading blocks it holds."""
        alive = {r for r in replicas if r in self._lru}
        depth: dict[str, int] = {}
        matched = 0
        for h in blocks:
            holders = self._holders.get(h)
            still = alive & holders if holders else set()
            for r in alive - still:
                if matched:
                    depth[r] = matched
            alive = still
            if not alive:
                break
            matched += 1
        for r in alive:
            depth[r] = matched
        return depth

    def insert(self, replica: str, blocks: Sequence[int]) -> None:
        """Record that ``replica`` now holds ``blocks``. Leading blocks are touched last, so a
        shared root outlives the tails hanging from it (the radix cache evicts leaves first)."""
        lru = self._lru.setdefault(replica, OrderedDict())
        for h in reversed(blocks):
            lru.pop(h, None)
            lru[h] = None
            self._holders.setdefault(h, set()).add(replica)
        self._evict(replica)

    def forget(self, replica: str) -> None:
        """Drop a replica (it died, or was scaled away): its cache went with it."""
        for h in self._lru.pop(replica, OrderedDict()):
            self._drop(h, replica)
        self._capacity.pop(replica, None)

    def _evict(self, replica: str) -> None:
        lru = self._lru.get(replica)
        if lru is None:
            return
        cap = self._capacity.get(replica, self.default_capacity_blocks)
        while len(lru) > cap:
            h, _ = lru.popitem(last=False)
            self._drop(h, replica)

    def _drop(self, h: int, replica: str) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(replica)
            if not holders:
                del self._holders[h]

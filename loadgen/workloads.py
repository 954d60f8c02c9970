"""Workloads: the prompts of a run, built up front from a seed, with a fingerprint.

Prompts are token ids wherever we build them, so their length is exact: the HTTP target sends
the ids themselves to ``/v1/completions`` (the chat endpoint gets their decoded text) and the
engine target passes them straight in.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class TokenizerLike(Protocol):
    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def vocab_size(self) -> int: ...

    def is_special(self, token_id: int) -> bool: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True)
class WorkItem:
    prompt_ids: list[int] | None  # exact prompt; None when only text is known
    prompt_text: str | None
    max_tokens: int
    timestamp: float | None = None  # trace replay: when to send, seconds from the trace start

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids) if self.prompt_ids is not None else 0


def fingerprint(items: Sequence[WorkItem]) -> str:
    """sha256 of the prompts and output lengths: equal fingerprints mean identical workloads."""
    h = hashlib.sha256()
    for it in items:
        h.update(json.dumps([it.prompt_ids, it.prompt_text, it.max_tokens, it.timestamp]).encode())
    return h.hexdigest()[:16]


def length_range(mean: int, ratio: float) -> tuple[int, int]:
    """The written range definition: uniform integers in [mean·(1−ratio), mean·(1+ratio)], at least 1."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"range ratio must be in [0, 1], got {ratio}")
    return max(1, round(mean * (1 - ratio))), max(1, round(mean * (1 + ratio)))


class _IdSampler:
    """Draws ordinary (non-special) token ids; a leading BOS counts toward the length."""

    def __init__(self, tok: TokenizerLike, rng: random.Random) -> None:
        self.rng = rng
        self.bos = tok.bos_token_id
        # Low ids of most vocabularies are control or byte tokens, and the top of Gemma's is
        # mostly unused slots; drawing from the ordinary middle keeps prompts plain text.
        hi = min(tok.vocab_size, 50_000)
        self.pool = [i for i in range(min(300, hi // 4), hi) if not tok.is_special(i)]

    def ids(self, n: int, with_bos: bool = True) -> list[int]:
        lead = [self.bos] if with_bos and self.bos is not None else []
        return lead + [self.rng.choice(self.pool) for _ in range(max(0, n - len(lead)))]


def random_workload(
    tok: TokenizerLike, n: int, input_len: int, output_len: int, range_ratio: float, seed: int
) -> list[WorkItem]:
    rng = random.Random(seed)
    sampler = _IdSampler(tok, rng)
    in_lo, in_hi = length_range(input_len, range_ratio)
    out_lo, out_hi = length_range(output_len, range_ratio)
    items = []
    for _ in range(n):
        ids = sampler.ids(rng.randint(in_lo, in_hi))
        items.append(WorkItem(ids, None, rng.randint(out_lo, out_hi)))
    return items


def shared_prefix_workload(
    tok: TokenizerLike, groups: int, per_group: int, system_len: int, question_len: int, output_len: int, seed: int
) -> list[WorkItem]:
    """``groups`` system prompts, each shared by ``per_group`` questions; order shuffled (seeded)."""
    rng = random.Random(seed)
    sampler = _IdSampler(tok, rng)
    items = []
    for _ in range(groups):
        prefix = sampler.ids(system_len)
        for _ in range(per_group):
            items.append(WorkItem(prefix + sampler.ids(question_len, with_bos=False), None, output_len))
    rng.shuffle(items)
    return items


def sharegpt_workload(
    tok: TokenizerLike, path: Path, n: int, seed: int, output_len: int | None = None, max_input: int = 4096
) -> list[WorkItem]:
    """First human turn as the prompt; the first reply's token count as the output length.

    Accepts a JSON list or JSONL of ``{"conversations": [{"from": ..., "value": ...}, ...]}``
    (``role``/``content`` also accepted).
    """
    text = path.read_text()
    rows: list[Any] = (
        json.loads(text)
        if text.lstrip().startswith("[")
        else [json.loads(line) for line in text.splitlines() if line.strip()]
    )
    rng = random.Random(seed)
    rng.shuffle(rows)
    items: list[WorkItem] = []
    for row in rows:
        turns = row.get("conversations") or row.get("messages") or []
        if len(turns) < 2:
            continue
        prompt = str(turns[0].get("value", turns[0].get("content", "")))
        reply = str(turns[1].get("value", turns[1].get("content", "")))
        ids = tok.encode(prompt, add_special_tokens=True)
        out = output_len if output_len is not None else len(tok.encode(reply))
        if len(ids) < 2 or out < 1 or len(ids) > max_input:
            continue
        items.append(WorkItem(ids, prompt, out))
        if len(items) == n:
            break
    if not items:
        raise ValueError(f"{path}: no usable conversations (need a prompt and a reply)")
    return items


def trace_workload(tok: TokenizerLike, path: Path, seed: int, limit: int | None = None) -> list[WorkItem]:
    """JSONL: ``{"timestamp": s, "input_length": n, "output_length": m}`` per line (``prompt``
    text may replace ``input_length``). Timestamps are seconds (or ms if ``timestamp_ms``)."""
    rng = random.Random(seed)
    sampler = _IdSampler(tok, rng)
    items: list[WorkItem] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        ts = float(row["timestamp"]) if "timestamp" in row else float(row["timestamp_ms"]) / 1000.0
        if "prompt" in row:
            ids = tok.encode(str(row["prompt"]), add_special_tokens=True)
        else:
            ids = sampler.ids(int(row["input_length"]))
        items.append(WorkItem(ids, row.get("prompt"), int(row["output_length"]), ts))
        if limit is not None and len(items) == limit:
            break
    if not items:
        raise ValueError(f"{path}: empty trace")
    t0 = min(it.timestamp or 0.0 for it in items)
    items = [WorkItem(it.prompt_ids, it.prompt_text, it.max_tokens, (it.timestamp or 0.0) - t0) for it in items]
    return sorted(items, key=lambda it: it.timestamp or 0.0)

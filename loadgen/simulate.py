"""Scale-out simulation: a workload replayed against N simulated engine replicas.

For the scale this machine cannot run (1–64 GPUs), the router's own policies
(``aserve/routing/policy.py``, the code the Ray Serve router runs) choose a replica for
each request as it arrives, from each replica's load (running + waiting, as the engines
report it); each replica is a discrete-event model of an engine:

- continuous batching: every step admits waiting requests (first come, first served) while
  the step's token budget, the running limit and the KV pool allow, chunks long prefills,
  and decodes one token for every running request past its prefill;
- a step costs ``step_s + prefill_token_s × computed prompt tokens + decode_seq_s ×
  decoding requests`` (the cost model: set it from a device's measured figures);
- a prefix cache of page-aligned blocks (the router's own ``PrefixIndex``, one per replica,
  here holding the truth): a request computes only the prompt past its longest cached
  prefix, and its prompt is cached when its prefill ends; the cache gets the KV pool less
  what running requests hold, least recently used blocks evicted first.

Throughput is output tokens over the time from the first arrival to the last completion;
the hit rate is prompt tokens served from cache over all prompt tokens.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from aserve.routing.policy import Balance, make_policy
from aserve.routing.prefix import PrefixIndex, block_hashes
from loadgen.workloads import WorkItem


@dataclass(frozen=True)
class CostModel:
    step_s: float = 0.004  # per step: launch, sampling, host work not hidden
    prefill_token_s: float = 20e-6  # per computed prompt token
    decode_seq_s: float = 40e-6  # per decoding request in a step
    max_batched_tokens: int = 8192
    max_running: int = 256
    kv_tokens: int = 131_072  # one replica's KV pool (running requests + prefix cache)
    page: int = 16


@dataclass(eq=False)
class _Req:
    index: int
    arrival: float
    prompt_len: int
    max_tokens: int
    blocks: list[int]
    cached: int = -1  # prompt tokens found in the cache at admission; -1: not admitted
    prefill_left: int = 0
    outputs: int = 0
    first_token: float | None = None
    finished: float | None = None

    @property
    def reserved_tokens(self) -> int:  # KV it may hold beyond the cached prefix it shares
        return self.prompt_len - self.cached + self.max_tokens


class SimReplica:
    def __init__(self, name: str, cost: CostModel) -> None:
        self.name = name
        self.cost = cost
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.cache = PrefixIndex()
        self.busy = False
        self.hit_tokens = 0
        self.prompt_tokens = 0

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def _cached_tokens(self, req: _Req) -> int:
        depth = self.cache.match(req.blocks, [self.name]).get(self.name, 0)
        return min(depth * self.cost.page, req.prompt_len - 1)  # the last token is always computed

    def _admit(self) -> int:
        """Admit what fits; returns this step's prompt tokens to compute."""
        c = self.cost
        budget = c.max_batched_tokens
        held = sum(r.reserved_tokens for r in self.running)
        for r in self.running:  # chunked prefills go on first
            if r.prefill_left and budget:
                budget -= min(r.prefill_left, budget)
        computed = c.max_batched_tokens - budget
        while self.waiting and len(self.running) < c.max_running and budget > 0:
            req = self.waiting[0]
            cached = self._cached_tokens(req)
            need = req.prompt_len - cached + req.max_tokens
            room_blocks = (c.kv_tokens - held - need) // c.page
            if room_blocks < 0:
                break  # the pool is full: wait for running requests to finish
            self.cache.set_capacity(self.name, room_blocks)  # the cache gets what is left
            self.waiting.popleft()
            req.cached, req.prefill_left = cached, req.prompt_len - cached
            self.hit_tokens += cached
            self.prompt_tokens += req.prompt_len
            take = min(req.prefill_left, budget)
            budget -= take
            computed += take
            held += need
            self.running.append(req)
        return computed

    def step(self, now: float) -> float:
        """Plan one step at ``now``; returns its duration (apply it with :meth:`finish_step`)."""
        decoding = sum(1 for r in self.running if not r.prefill_left)
        computed = self._admit()
        return self.cost.step_s + self.cost.prefill_token_s * computed + self.cost.decode_seq_s * decoding

    def finish_step(self, end: float) -> list[_Req]:
        """The step ended at ``end``: prefill chunks land, every decoder gets a token."""
        budget = self.cost.max_batched_tokens
        done: list[_Req] = []
        keep: list[_Req] = []
        for r in self.running:
            if r.prefill_left:
                take = min(r.prefill_left, budget)
                budget -= take
                r.prefill_left -= take
                if r.prefill_left:
                    keep.append(r)
                    continue
                self.cache.insert(self.name, r.blocks)
            r.outputs += 1
            if r.first_token is None:
                r.first_token = end
            if r.outputs >= r.max_tokens:
                r.finished = end
                done.append(r)
            else:
                keep.append(r)
        self.running = keep
        return done


@dataclass
class SimResult:
    policy: str
    replicas: int
    requests: int
    output_tokens: int
    makespan_s: float
    output_tok_per_s: float
    hit_rate: float
    ttft_p50_s: float
    ttft_p99_s: float
    per_replica_requests: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def simulate(
    items: Sequence[WorkItem],
    arrivals: Sequence[float],
    replicas: int,
    policy_name: str,
    cost: CostModel,
    balance: Balance | None = None,
) -> SimResult:
    """Replay ``items`` (sent at ``arrivals``, seconds) against ``replicas`` simulated engines."""
    policy = make_policy(policy_name, balance)
    pool = [SimReplica(f"r{k:03d}", cost) for k in range(replicas)]
    by_name = {r.name: r for r in pool}
    for r in pool:
        policy.set_capacity(r.name, cost.kv_tokens // cost.page)
    seq = itertools.count()
    events: list[tuple[float, int, str, Any]] = []
    for it, t in zip(items, arrivals):
        ids = it.prompt_ids or []
        req = _Req(next(seq), t, len(ids), it.max_tokens, block_hashes(ids, cost.page))
        heapq.heappush(events, (t, req.index, "arrive", req))
    counts = dict.fromkeys(by_name, 0)
    finished: list[_Req] = []
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            req = payload
            name = policy.choose(req.blocks, {r.name: r.load for r in pool})[0]
            policy.routed(name, req.blocks)
            counts[name] += 1
            replica = by_name[name]
            replica.waiting.append(req)
            if not replica.busy:
                replica.busy = True
                heapq.heappush(events, (now + replica.step(now), next(seq), "step", replica))
        else:
            replica = payload
            finished += replica.finish_step(now)
            if replica.running or replica.waiting:
                heapq.heappush(events, (now + replica.step(now), next(seq), "step", replica))
            else:
                replica.busy = False
    assert len(finished) == len(items), f"{len(items) - len(finished)} requests never finished"
    start = min(arrivals) if arrivals else 0.0
    end = max(r.finished or 0.0 for r in finished) if finished else 0.0
    out_tokens = sum(r.outputs for r in finished)
    ttfts = sorted((r.first_token or 0.0) - r.arrival for r in finished)
    hits = sum(r.hit_tokens for r in pool)
    prompts = sum(r.prompt_tokens for r in pool)
    span = max(end - start, 1e-9)
    return SimResult(
        policy=policy_name,
        replicas=replicas,
        requests=len(finished),
        output_tokens=out_tokens,
        makespan_s=span,
        output_tok_per_s=out_tokens / span,
        hit_rate=hits / prompts if prompts else 0.0,
        ttft_p50_s=statistics.median(ttfts) if ttfts else 0.0,
        ttft_p99_s=ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else 0.0,
        per_replica_requests=[counts[r.name] for r in pool],
    )


class SyntheticVocab:
    """Enough of a tokenizer for the workload builders: the simulator needs ids, not text."""

    bos_token_id = 2
    vocab_size = 50_000

    def is_special(self, token_id: int) -> bool:
        return token_id < 300

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        lead = [self.bos_token_id] if add_special_tokens else []
        return lead + [300 + b for b in text.encode()]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(i - 300 for i in ids if i >= 300).decode(errors="replace")

"""Which replica a request goes to: prefix affinity, round-robin, least-loaded.

Every policy answers a *ranking* of the replicas: the first is the choice, the rest are the
fall-backs a caller tries in order when the first cannot take the request (Ray Serve's
router does, when a replica's queue is full). ``loads`` is each replica's load in requests
(running + waiting, from the engine's own stats or the router's count, whichever is larger).

Prefix affinity (SGLang's cache-aware router, Ray Serve LLM's prefix-aware router): send a
request to the replica whose cache holds the longest prefix of its prompt, unless that
replica is *much busier* than the least-loaded one (more than ``balance_abs`` requests more
*and* more than ``balance_rel`` times as many); a prompt with no cached prefix goes to the
least-loaded replica, ties broken toward the one caching least (room for a new prefix).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from aserve.routing.prefix import PrefixIndex

POLICIES = ("prefix", "round-robin", "least-loaded")


class RoutingPolicy(Protocol):
    name: str

    def choose(self, blocks: Sequence[int], loads: Mapping[str, float]) -> list[str]:
        """Every replica of ``loads``, best first. ``loads`` is not empty."""
        ...

    def routed(self, replica: str, blocks: Sequence[int]) -> None:
        """The request was sent to ``replica``."""
        ...

    def set_capacity(self, replica: str, blocks: int) -> None:
        """``replica``'s KV pool holds about ``blocks`` blocks."""
        ...

    def forget(self, replica: str) -> None:
        """``replica`` is gone."""
        ...


def _by_load(loads: Mapping[str, float], first: str) -> list[str]:
    return [first, *sorted((r for r in loads if r != first), key=lambda r: (loads[r], r))]


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = itertools.count()

    def choose(self, blocks: Sequence[int], loads: Mapping[str, float]) -> list[str]:
        ids = sorted(loads)
        return _by_load(loads, ids[next(self._next) % len(ids)])

    def routed(self, replica: str, blocks: Sequence[int]) -> None:
        pass

    def set_capacity(self, replica: str, blocks: int) -> None:
        pass

    def forget(self, replica: str) -> None:
        pass


class LeastLoaded(RoundRobin):
    """The least-loaded replica; ties rotate, so an idle cluster still spreads its requests."""

    name = "least-loaded"

    def choose(self, blocks: Sequence[int], loads: Mapping[str, float]) -> list[str]:
        ids = sorted(loads)
        turn = next(self._next)
        first = min(ids, key=lambda r: (loads[r], (ids.index(r) - turn) % len(ids)))
        return _by_load(loads, first)


@dataclass(frozen=True)
class Balance:
    """When the replica holding a prefix counts as much busier than the least-loaded one."""

    abs: float = 8.0  # at least this many requests more ...
    rel: float = 1.5  # ... and more than this many times as many
    min_match_blocks: int = 1  # a shorter cached prefix is not worth following

    def much_busier(self, load: float, least: float) -> bool:
        return load - least > self.abs and load > self.rel * least


class PrefixAffinity:
    name = "prefix"

    def __init__(self, balance: Balance | None = None, index: PrefixIndex | None = None) -> None:
        self.balance = balance or Balance()
        self.index = index or PrefixIndex()
        self.num_affinity = 0  # choices that followed a cached prefix
        self.num_balanced = 0  # choices where the prefix's replica was too busy

    def choose(self, blocks: Sequence[int], loads: Mapping[str, float]) -> list[str]:
        ids = sorted(loads)
        least = min(ids, key=lambda r: (loads[r], self.index.size(r), r))
        matches = self.index.match(blocks, ids)
        if matches:
            depth = max(matches.values())
            best = min((r for r, d in matches.items() if d == depth), key=lambda r: (loads[r], r))
            if depth >= self.balance.min_match_blocks:
                if not self.balance.much_busier(loads[best], loads[least]):
                    self.num_affinity += 1
                    return _by_load(loads, best)
                self.num_balanced += 1
        return _by_load(loads, least)

    def routed(self, replica: str, blocks: Sequence[int]) -> None:
        self.index.insert(replica, blocks)

    def set_capacity(self, replica: str, blocks: int) -> None:
        self.index.set_capacity(replica, blocks)

    def forget(self, replica: str) -> None:
        self.index.forget(replica)


def make_policy(name: str, balance: Balance | None = None) -> RoutingPolicy:
    if name == "prefix":
        return PrefixAffinity(balance)
    if name == "round-robin":
        return RoundRobin()
    if name == "least-loaded":
        return LeastLoaded()
    raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(POLICIES)}")

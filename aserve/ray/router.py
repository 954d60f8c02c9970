"""The Ray Serve request router of the engine replicas: aserve's routing policies on Serve's API.

Serve builds one router per deployment handle (in the ingress) and asks it for each request
which replicas to try (:meth:`AserveRequestRouter.choose_replicas`, a ranking); it then
sends the request to the first of a rank whose queue is not full. The policy itself is plain
Python (``aserve/routing/policy.py``); this class only feeds it:

- the request's prompt blocks and policy name, which the ingress passes as keyword arguments
  of the handle call (``route_blocks``, ``routing``);
- each replica's load: the larger of the requests this router has in flight there and the
  replica engine's own ``running + waiting`` (its routing stats, polled by Serve every
  ``request_routing_stats_period_s``; other ingress replicas' requests show only there);
- each replica's KV capacity, which bounds the policy's guess of its prefix cache.

A call with ``fanout=k`` goes to the k-th replica in replica-id order, which is how the
ingress reaches every replica once (``/metrics``, ``/admin/flush_cache``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from aserve.routing.policy import Balance, RoutingPolicy, make_policy


class AserveRequestRouter(RequestRouter):
    def initialize_state(  # type: ignore[override]  # Serve passes request_router_kwargs
        self, balance_abs: float = Balance.abs, balance_rel: float = Balance.rel, default_routing: str = "prefix"
    ) -> None:
        """``request_router_kwargs`` of the deployment's ``request_router_config``; the policy
        comes with each request (``routing``), ``default_routing`` serves calls without one."""
        self._balance = Balance(abs=balance_abs, rel=balance_rel)
        self._default_routing = default_routing
        self._policies: dict[str, RoutingPolicy] = {}
        self._in_flight: Counter[str] = Counter()

    def _policy(self, name: str) -> RoutingPolicy:
        policy = self._policies.get(name)
        if policy is None:
            policy = self._policies[name] = make_policy(name, self._balance)
        return policy

    def _load(self, replica: RunningReplica, policy: RoutingPolicy) -> float:
        stats = replica.routing_stats or {}
        rid = replica.replica_id.unique_id
        kv_total, page = stats.get("kv_total_tokens"), stats.get("page_size")
        if kv_total and page:
            policy.set_capacity(rid, int(kv_total) // int(page))
        engine_load = float(stats.get("running", 0)) + float(stats.get("waiting", 0))
        return max(engine_load, float(self._in_flight[rid]))

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        kwargs: dict[str, Any] = pending_request.kwargs if pending_request is not None else {}
        fanout = kwargs.get("fanout")
        if fanout is not None:
            ids = sorted(by_id)
            return [[by_id[ids[int(fanout) % len(ids)]]]]
        policy = self._policy(kwargs.get("routing") or self._default_routing)
        loads = {rid: self._load(r, policy) for rid, r in by_id.items()}
        ranked = policy.choose(kwargs.get("route_blocks") or [], loads)
        return [[by_id[ranked[0]]], [by_id[r] for r in ranked[1:]]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        rid = replica_id.unique_id
        self._in_flight[rid] += 1
        kwargs = pending_request.kwargs
        if kwargs.get("fanout") is None:
            self._policy(kwargs.get("routing") or self._default_routing).routed(rid, kwargs.get("route_blocks") or [])

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        rid = replica_id.unique_id
        if self._in_flight[rid] > 0:
            self._in_flight[rid] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        rid = replica_id.unique_id
        self._in_flight.pop(rid, None)
        for policy in self._policies.values():
            policy.forget(rid)

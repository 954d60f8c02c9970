"""What the Ray application is made of, apart from the engine's own config (no Ray import here:
``aserve serve --help`` reads it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aserve.routing.policy import Balance


@dataclass(frozen=True)
class RayOptions:
    replicas: int = 1
    # GPUs each replica holds (Serve places it); None: 1 when the engine's device is CUDA, else 0.
    gpus_per_replica: float | None = None
    cpus_per_replica: float = 1.0
    routing: str = "prefix"
    balance: Balance = field(default_factory=Balance)
    # Serve's autoscaling_config for the replicas (min_replicas, max_replicas,
    # target_ongoing_requests, ...): passed through as is; replaces ``replicas``.
    autoscaling: Mapping[str, Any] | None = None
    max_ongoing_requests: int = 1024  # per replica: the engine queues and sheds load itself (429)
    # Ingress replicas: each relays every SSE chunk of its requests in one Python process, so
    # past one engine replica's worth of streams give it more (Serve's proxy spreads them).
    ingress_replicas: int = 1
    stats_period_s: float = 1.0  # how often Serve polls each engine's load for the router

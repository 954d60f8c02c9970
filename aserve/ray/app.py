"""The Ray Serve application: N engine replicas behind one ingress, and its builders.

- :func:`application` builds it from an ``EngineConfig`` and :class:`RayOptions`
  (``aserve serve --ray`` calls it);
- ``aserve/ray/builder.py`` builds it for Serve's own tooling (``serve run``, config files).
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from aserve.config import EngineConfig
from aserve.ray.ingress import Ingress, IngressOptions
from aserve.ray.options import RayOptions
from aserve.ray.replica import EngineReplica, ReplicaOptions
from aserve.ray.router import AserveRequestRouter
from aserve.server.limits import DEFAULT_BODY_LIMITS, BodyLimits

REPLICA_DEPLOYMENT = "AserveReplica"
INGRESS_DEPLOYMENT = "AserveIngress"


def _uses_cuda(config: EngineConfig) -> bool:
    if config.device is not None:
        return config.device.startswith("cuda")
    import torch

    return bool(torch.cuda.is_available())


def application(
    config: EngineConfig,
    options: RayOptions | None = None,
    *,
    api_key: str | None = None,
    served_model_name: str | None = None,
    body: BodyLimits = DEFAULT_BODY_LIMITS,
) -> serve.Application:
    options = options or RayOptions()
    gpus = options.gpus_per_replica
    if gpus is None:
        gpus = 1.0 if _uses_cuda(config) else 0.0
    actor_options: dict[str, Any] = {"num_cpus": options.cpus_per_replica, "num_gpus": gpus}
    scale: dict[str, Any] = (
        {"autoscaling_config": dict(options.autoscaling)}
        if options.autoscaling is not None
        else {"num_replicas": options.replicas}
    )
    # Built from a dict: its pydantic __init__ is typed as taking only dicts. The policy's
    # name travels with each request (the ingress's option), not here: changing it then
    # redeploys only the ingress, and the replicas keep their engines and caches.
    router_fields: dict[str, Any] = {
        "request_router_class": AserveRequestRouter,
        "request_router_kwargs": {
            "balance_abs": options.balance.abs,
            "balance_rel": options.balance.rel,
        },
        "request_routing_stats_period_s": options.stats_period_s,
        "request_routing_stats_timeout_s": max(5.0, 5 * options.stats_period_s),
    }
    router = RequestRouterConfig(**router_fields)
    replica: Any = serve.deployment(
        EngineReplica,
        name=REPLICA_DEPLOYMENT,
        ray_actor_options=actor_options,
        max_ongoing_requests=options.max_ongoing_requests,
        request_router_config=router,
        health_check_period_s=5,
        graceful_shutdown_timeout_s=30,
        **scale,
    )
    ingress: Any = serve.deployment(
        serve.ingress()(Ingress),
        name=INGRESS_DEPLOYMENT,
        ray_actor_options={"num_cpus": 0},
        num_replicas=options.ingress_replicas,
        max_ongoing_requests=100_000,  # it only relays; the replicas' queues are the limit
    )
    replica_opts = ReplicaOptions(config, api_key, served_model_name or config.model, body)
    ingress_opts = IngressOptions(routing=options.routing, block_tokens=config.page_size, body=body)
    return ingress.bind(replica.bind(replica_opts), ingress_opts)

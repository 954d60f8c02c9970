"""``aserve serve --ray``: the flags of the Ray application, and running it until a signal.

Ray owns the cluster: ``--ray-address`` joins one started with ``ray start --head`` (or
``RAY_ADDRESS``), and without it a local one is started for this process. Serve's HTTP proxy
listens on ``--host``/``--port``; the application is named ``aserve`` at route ``/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import threading
from typing import Any

from aserve.config import EngineConfig
from aserve.ray.options import RayOptions
from aserve.routing.policy import POLICIES, Balance
from aserve.server.limits import BodyLimits

APP_NAME = "aserve"


def add_ray_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scale-out on Ray Serve (pip install aserve[ray]; docs/scale-out.md)")
    g.add_argument("--ray", action="store_true", help="serve N engine replicas under Ray Serve behind one endpoint")
    g.add_argument("--replicas", type=int, default=1, help="engine replicas (default: %(default)s)")
    g.add_argument("--ray-address", default=None,
                   help="a running Ray cluster (`ray start --head`), e.g. auto or 10.0.0.1:6379; "
                   "default: RAY_ADDRESS, else a local cluster started here")  # fmt: skip
    g.add_argument("--routing", choices=POLICIES, default="prefix",
                   help="how requests pick a replica (default: %(default)s: the replica caching the "
                   "longest prefix of the prompt, unless it is much busier than the least-loaded one)")  # fmt: skip
    g.add_argument("--balance-abs", type=float, default=Balance.abs,
                   help="prefix routing: a replica is much busier with this many more requests ... (default: %(default)s)")  # fmt: skip
    g.add_argument("--balance-rel", type=float, default=Balance.rel,
                   help="... and this many times as many as the least-loaded one (default: %(default)s)")  # fmt: skip
    g.add_argument("--gpus-per-replica", type=float, default=None,
                   help="GPUs per replica (default: 1 with CUDA, else 0)")  # fmt: skip
    g.add_argument("--cpus-per-replica", type=float, default=1.0, help="CPUs per replica (default: %(default)s)")
    g.add_argument("--ingress-replicas", type=int, default=1,
                   help="ingress replicas relaying the HTTP streams (default: %(default)s)")  # fmt: skip
    g.add_argument("--autoscaling-config", type=json.loads, default=None,
                   help="Serve's autoscaling_config as JSON, passed through (replaces --replicas), e.g. "
                   '\'{"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 64}\'')  # fmt: skip


def ray_options_from_args(args: argparse.Namespace) -> RayOptions:
    return RayOptions(
        replicas=args.replicas,
        gpus_per_replica=args.gpus_per_replica,
        cpus_per_replica=args.cpus_per_replica,
        routing=args.routing,
        balance=Balance(abs=args.balance_abs, rel=args.balance_rel),
        autoscaling=args.autoscaling_config,
        ingress_replicas=args.ingress_replicas,
    )


def run_serve_on_ray(
    args: argparse.Namespace, config: EngineConfig, *, api_key: str | None, served_model_name: str, body: BodyLimits
) -> int:
    """Deploy, serve until SIGTERM/SIGINT, then delete the application (Serve drains its replicas)."""
    try:
        import ray
        from ray import serve

        from aserve.ray.app import application
    except ImportError as exc:
        print(f"error: --ray needs Ray Serve: pip install 'aserve[ray]' ({exc})", file=sys.stderr)
        return 2
    app = application(config, ray_options_from_args(args), api_key=api_key, served_model_name=served_model_name,
                      body=body)  # fmt: skip
    ray.init(address=args.ray_address, logging_level=logging.WARNING)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, which installs its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        # Ray's proxy keeps idle connections for the same reason as Hypercorn does (BodyLimits).
        serve.start(http_options={"host": args.host, "port": args.port,
                                  "keep_alive_timeout_s": math.ceil(body.idle_connection_s)})  # fmt: skip
        serve.run(app, name=APP_NAME, route_prefix="/")
        print(f"serving {served_model_name} on http://{args.host}:{args.port} with Ray Serve "
              f"({_replicas_text(args)}, routing: {args.routing})", file=sys.stderr)  # fmt: skip
        stop.wait()
        serve.delete(APP_NAME)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


def _replicas_text(args: argparse.Namespace) -> str:
    auto: dict[str, Any] | None = args.autoscaling_config
    if auto is not None:
        return f"autoscaling {auto.get('min_replicas', 1)}-{auto.get('max_replicas', '?')} replicas"
    return f"{args.replicas} replica" + ("s" if args.replicas != 1 else "")

"""The application builder for Serve's own tooling.

``serve run aserve.ray.builder:build_app replicas=2 kv-cache-bytes=67108864``, or a Serve
config file's application with ``import_path: aserve.ray.builder:build_app`` and ``args``:
each arg is an ``aserve serve`` flag without its dashes (``true`` for a switch). A config
file's ``deployments`` section overrides what Serve owns on the ``AserveReplica`` deployment
(``num_replicas``, ``autoscaling_config``, ``ray_actor_options``); see ``docs/scale-out.md``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ray import serve

from aserve.config import engine_config_from_args
from aserve.ray.app import application
from aserve.ray.command import ray_options_from_args
from aserve.server.command import API_KEY_ENV, add_serve_subcommand
from aserve.server.limits import BodyLimits


def build_app(args: dict[str, Any]) -> serve.Application:
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + str(key).replace("_", "-")
        if str(value).lower() in ("", "true"):
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    parser = argparse.ArgumentParser(prog="aserve.ray.builder")
    add_serve_subcommand(parser.add_subparsers(dest="command", required=True))
    a = parser.parse_args(["serve", *argv])
    config = engine_config_from_args(a)
    return application(
        config,
        ray_options_from_args(a),
        api_key=a.api_key or os.environ.get(API_KEY_ENV) or None,
        served_model_name=a.served_model_name or config.model,
        body=BodyLimits(a.max_body_bytes, a.body_timeout, a.sse_keepalive, a.keep_alive_timeout),
    )

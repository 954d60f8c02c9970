"""The specs of a run (target, workload, arrivals) built from parsed command-line arguments.

Shared by ``run`` (``cli.py``) and ``overlap-ab`` (``overlap_ab.py``); the flags themselves are
added by ``cli.py``'s ``add_*_args``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from loadgen.runner import LoadSpec
from loadgen.session import TargetSpec, WorkloadSpec


def parse_kv(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``key=value`` options; values read as JSON when they parse (``2``, ``false``), else text."""
    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, _, raw = pair.partition("=")
        try:
            out[key.strip().replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip().replace("-", "_")] = raw
    return out


def target_spec(a: argparse.Namespace, *, require_target: bool = True) -> TargetSpec:
    if require_target and not a.engine and not a.base_url:
        raise SystemExit("give --base-url URL or --engine")
    return TargetSpec(
        base_url=None if a.engine else a.base_url,
        model=a.model,
        endpoint=a.endpoint,
        api_key=a.api_key,
        tokenizer=a.tokenizer,
        engine_options=parse_kv(a.engine_opt),
        ignore_eos=a.ignore_eos,
        return_token_ids=a.return_token_ids,
        request_timeout=a.request_timeout,
        ready_timeout=a.ready_timeout,
    )


def workload_spec(a: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        a.workload, a.num_requests, a.input_len, a.output_len, a.range_ratio, a.groups, a.per_group,
        a.system_len, a.question_len, a.dataset, a.seed,
    )  # fmt: skip


def load_spec(a: argparse.Namespace) -> LoadSpec:
    return LoadSpec(
        rate=a.rate, process=a.arrival, burstiness=a.burstiness, max_concurrency=a.max_concurrency, users=a.users,
        think_time=a.think_time, duration=a.duration, warmup=a.warmup, seed=a.seed, run_timeout=a.run_timeout,
    )  # fmt: skip

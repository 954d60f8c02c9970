"""The specs of a run (target, workload, arrivals) built from parsed command-line arguments.

Shared by ``run`` (``cli.py``) and ``overlap-ab`` (``overlap_ab.py``); the flags themselves are
added by ``cli.py``'s ``add_*_args``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
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


def _need(ok: bool, message: str) -> None:
    """A bad argument ends the command with its message (exit status 2), before anything runs."""
    if not ok:
        raise SystemExit(f"loadgen: {message}")


def workload_spec(a: argparse.Namespace) -> WorkloadSpec:
    kind = a.workload
    from_file = kind in ("sharegpt", "trace")
    _need(not from_file or a.dataset is not None, f"--workload {kind} needs --dataset PATH")
    _need(a.dataset is None or Path(a.dataset).is_file(), f"--dataset {a.dataset}: no such file")
    _need(a.num_requests is None or a.num_requests >= 1, f"--num-requests must be >= 1, got {a.num_requests}")
    _need(a.output_len is None or a.output_len >= 1, f"--output-len must be >= 1, got {a.output_len}")
    for name in ("input_len", "groups", "per_group", "system_len", "question_len"):
        value = getattr(a, name)
        _need(value >= 1, f"--{name.replace('_', '-')} must be >= 1, got {value}")
    _need(0 <= a.range_ratio < 1, f"--range-ratio must be in [0, 1), got {a.range_ratio}")
    # Unset: 50 requests of 16 tokens; a trace sends every line and sharegpt each reply's length (0).
    num = a.num_requests if a.num_requests is not None else 0 if kind == "trace" else 50
    out = a.output_len if a.output_len is not None else 0 if kind == "sharegpt" else 16
    return WorkloadSpec(
        kind, num, a.input_len, out, a.range_ratio, a.groups, a.per_group,
        a.system_len, a.question_len, a.dataset, a.seed,
    )  # fmt: skip


def load_spec(a: argparse.Namespace) -> LoadSpec:
    _need(a.rate > 0, f"--rate must be > 0 (inf: all at once), got {a.rate}")
    _need(
        a.max_concurrency is None or a.max_concurrency >= 1, f"--max-concurrency must be >= 1, got {a.max_concurrency}"
    )
    _need(a.users is None or a.users >= 1, f"--users must be >= 1, got {a.users}")
    _need(a.warmup >= 0, f"--warmup must be >= 0, got {a.warmup}")
    _need(a.duration is None or a.duration > 0, f"--duration must be > 0, got {a.duration}")
    _need(a.think_time >= 0, f"--think-time must be >= 0, got {a.think_time}")
    return LoadSpec(
        rate=a.rate, process=a.arrival, burstiness=a.burstiness, max_concurrency=a.max_concurrency, users=a.users,
        think_time=a.think_time, duration=a.duration, warmup=a.warmup, seed=a.seed, run_timeout=a.run_timeout,
    )  # fmt: skip

"""One measured run end to end: target open, workload built, run, summary, files written."""

from __future__ import annotations

import platform
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadgen import plots, report
from loadgen.honesty import client_view, warnings
from loadgen.metrics import SLO, summarize
from loadgen.runner import LoadSpec, Runner, Stopper, Target
from loadgen.server_view import delta
from loadgen.workloads import (
    TokenizerLike,
    WorkItem,
    fingerprint,
    random_workload,
    shared_prefix_workload,
    sharegpt_workload,
    trace_workload,
)


@dataclass(frozen=True)
class TargetSpec:
    base_url: str | None = None  # None: the in-process engine
    model: str | None = None  # None: the server's first model (/v1/models), or the engine's default
    endpoint: str = "completions"  # or "chat"
    api_key: str | None = None
    tokenizer: str | None = None  # a .gguf, an HF directory or "gemma-3-270m"; default: the model's
    engine_options: dict[str, Any] = field(default_factory=dict)
    ignore_eos: bool = True
    return_token_ids: bool = False  # HTTP: chunks carry their token ids (counted from them)
    request_timeout: float = 600.0
    ready_timeout: float = 300.0


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str = "random"  # random, shared-prefix, sharegpt, trace
    num_requests: int = 50
    input_len: int = 32
    output_len: int = 16
    range_ratio: float = 0.0
    groups: int = 4
    per_group: int = 8
    system_len: int = 64
    question_len: int = 16
    path: str | None = None  # sharegpt or trace file
    seed: int = 0


def load_tokenizer(name: str) -> TokenizerLike:
    from aserve.models.loader import resolve_model_path
    from aserve.tokenizer.tokenizer import load_tokenizer as load

    path = resolve_model_path(name) if not Path(name).exists() or name.endswith(".gguf") else Path(name)
    tok: TokenizerLike = load(path)
    return tok


@asynccontextmanager
async def open_target(spec: TargetSpec) -> AsyncIterator[tuple[Target, TokenizerLike]]:
    """The target and the tokenizer to build prompts with (the engine's own, in process)."""
    if spec.base_url is None:
        from loadgen.target_engine import EngineTarget

        options = {**({"model": spec.model} if spec.model else {}), **spec.engine_options}
        async with EngineTarget.open(
            options, ignore_eos=spec.ignore_eos, request_timeout=spec.request_timeout
        ) as engine_target:
            yield engine_target, engine_target.tokenizer
        return
    from loadgen.target_http import HttpTarget

    target = HttpTarget(
        spec.base_url,
        spec.model or "",
        endpoint=spec.endpoint,
        api_key=spec.api_key,
        ignore_eos=spec.ignore_eos,
        request_timeout=spec.request_timeout,
        extra_body={"return_token_ids": True} if spec.return_token_ids else None,
    )
    try:
        if spec.model is None:
            # Ask the server what it serves rather than guess a name it would answer 404 to.
            await target.wait_ready(spec.ready_timeout)
            try:
                target.model = await target.served_model()
            except ValueError as exc:
                raise SystemExit(str(exc)) from exc
        tok = load_tokenizer(spec.tokenizer or target.model)
        target.tokenizer = tok
        yield target, tok
    finally:
        await target.aclose()


def build_workload(w: WorkloadSpec, tok: TokenizerLike) -> list[WorkItem]:
    if w.kind == "random":
        return random_workload(tok, w.num_requests, w.input_len, w.output_len, w.range_ratio, w.seed)
    if w.kind == "shared-prefix":
        return shared_prefix_workload(tok, w.groups, w.per_group, w.system_len, w.question_len, w.output_len, w.seed)
    if w.kind == "sharegpt":
        assert w.path, "--dataset PATH is needed for sharegpt"
        return sharegpt_workload(tok, Path(w.path), w.num_requests, w.seed, w.output_len or None)
    if w.kind == "trace":
        assert w.path, "--dataset PATH is needed for trace"
        return trace_workload(tok, Path(w.path), w.seed, w.num_requests or None)
    raise ValueError(f"unknown workload {w.kind!r}")


async def run_once(
    target: Target,
    items: Sequence[WorkItem],
    load: LoadSpec,
    slo: SLO,
    *,
    label: str,
    meta: dict[str, Any],
    progress: bool = True,
    scrape: bool = True,
    stopper: Stopper | None = None,
) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """Run and summarize; returns (summary, measured records, warm-up records). ``scrape``:
    read the server's counters just before and after the run. ``stopper`` can end it early."""
    runner = Runner(target, load, progress=progress, scrape=scrape)
    if stopper is not None:
        stopper.attach(runner)
    out = await runner.run(items)
    measured = list(out.records)
    fixed_len = meta.get("workload", {}).get("range_ratio", 0) == 0 and meta.get("ignore_eos", True)
    summary = summarize(measured, slo, last_send_s=out.last_send_s, expect_exact=bool(fixed_len))
    summary["client"] = {**client_view(measured, out.loop_lags), "cpu_s": out.cpu_s}
    summary["server"] = delta(out.counters_before, out.counters_after)
    summary["run"] = {
        **meta,
        "label": label,
        "load": asdict(load),
        "fingerprint": fingerprint(items),
        "wall_s": out.wall_s,
        "t0_perf_counter": out.t0_perf,
        "warmup_requests": len(out.warmup_records),
        "cancelled_at_run_timeout": out.cancelled_at_timeout,
        "stopped_at_s": out.stopped_at,  # stopped early (a signal): in-flight requests unfinished
        "complete": True,  # we got here: every request ended or was listed as unfinished
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
    }
    summary["warnings"] = warnings(summary)
    return summary, measured, out.warmup_records


def save_run(
    out_dir: Path, label: str, summary: dict[str, Any], records: Sequence[Any], warm: Sequence[Any], *, do_plots: bool
) -> dict[str, str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "json": out_dir / f"{label}.json",
        "jsonl": out_dir / f"{label}.jsonl",
        "csv": out_dir / f"{label}.csv",
    }
    report.write_jsonl([*warm, *records], files["jsonl"])
    report.write_csv([*warm, *records], files["csv"])
    names = {k: str(v) for k, v in files.items()}
    if do_plots:
        for p in plots.all_run_plots([(label, records, summary)], out_dir, f"{label}_"):
            names[p.stem.removeprefix(f"{label}_")] = str(p)
    summary["files"] = names
    report.write_json(summary, files["json"])
    return names

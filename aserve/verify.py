"""``aserve verify``: the same seeded workload, serial and overlapped, must agree exactly.

Compares per request: token ids, finish reason, streamed text vs final text; and after the
run: the KV ledger is balanced and all free. Exits non-zero at the first difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from aserve.config import EngineConfig, add_engine_args, engine_config_from_args
from aserve.errors import AserveError
from aserve.logs import configure_logging
from aserve.progress import Progress, phase
from aserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from aserve.engine import Engine


def add_verify_args(parser: argparse.ArgumentParser) -> None:
    """The flags of ``aserve verify``: the workload's size and seed, and every engine flag."""
    parser.add_argument("--num-requests", type=int, default=24, help="requests in the workload (default: %(default)s)")
    parser.add_argument(
        "--workload-seed", type=int, default=0, help="seed of the prompts, lengths and arrivals (default: %(default)s)"
    )
    add_engine_args(parser)


@dataclass(frozen=True)
class WorkItem:
    prompt: list[int]
    params: SamplingParams
    delay_s: float  # arrival offset from the start of the run


@dataclass
class ItemResult:
    token_ids: list[int]
    finish_reason: str | None
    streamed_text: str
    final_text: str


def make_workload(vocab_size: int, num: int, seed: int, eos: int | None = None) -> list[WorkItem]:
    """Seeded mix: greedy and sampled, short and long prompts, max_tokens = 1, stop ids."""
    rng = random.Random(seed)
    items = []
    for i in range(num):
        plen = rng.choice([1, 3, 8, 20, 40, 90])
        prompt = [rng.randrange(4, min(vocab_size, 30000)) for _ in range(plen)]
        kind = i % 4
        params = SamplingParams(
            max_tokens=rng.choice([1, 2, 5, 12, 24]),
            temperature=0.0 if kind in (0, 1) else rng.choice([0.7, 1.0]),
            top_p=1.0 if kind != 3 else 0.9,
            top_k=0 if kind != 2 else 20,
            seed=rng.randrange(2**31) if kind >= 2 else None,
            stop_token_ids=(prompt[-1],) if i % 5 == 0 else (),
        )
        items.append(WorkItem(prompt, params, delay_s=rng.random() * 0.2))
    return items


async def run_workload(engine: Engine, items: list[WorkItem], progress: Progress | None = None) -> list[ItemResult]:
    results: list[ItemResult | None] = [None] * len(items)
    done = 0

    async def one(i: int, item: WorkItem) -> None:
        await anyio.sleep(item.delay_s)
        streamed: list[str] = []
        ids: list[int] = []
        finish = None
        async for d in engine.generate(item.prompt, item.params):
            streamed.append(d.text)
            ids.extend(d.token_ids)
            finish = d.finish_reason or finish
        final = engine.tokenizer.decode(ids, skip_special_tokens=True)
        results[i] = ItemResult(ids, finish, "".join(streamed), final)
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, len(items))

    async with anyio.create_task_group() as tg:
        for i, item in enumerate(items):
            tg.start_soon(one, i, item)
    return [r for r in results if r is not None]


def first_difference(a: list[ItemResult], b: list[ItemResult]) -> str | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x.token_ids != y.token_ids:
            return f"request {i}: tokens differ: serial {x.token_ids} vs overlap {y.token_ids}"
        if x.finish_reason != y.finish_reason:
            return f"request {i}: finish reason {x.finish_reason} vs {y.finish_reason}"
        for name, r in (("serial", x), ("overlap", y)):
            if r.streamed_text != r.final_text:
                return f"request {i} ({name}): streamed text {r.streamed_text!r} != final {r.final_text!r}"
    return None


async def run_verify(args: argparse.Namespace) -> int:
    from aserve.engine import Engine  # here, not at the top: `aserve --help` adds these flags

    base = engine_config_from_args(args)
    outcomes = {}
    for overlap in (False, True):
        cfg = dataclasses.replace(base, overlap=overlap, debug=True)
        name = "overlap" if overlap else "serial"
        async with Engine(cfg) as engine:
            items = make_workload(engine.model_config.vocab_size, args.num_requests, args.workload_seed)
            with phase(f"verify: the {name} run", unit="request") as update:
                res = await run_workload(engine, items, update)
            ledger = engine.ledger()
            st = engine.stats()
            if not (ledger.balanced and ledger.all_free):
                print(f"FAIL: KV ledger not all free after the {'overlap' if overlap else 'serial'} run: {ledger}")
                return 1
            outcomes[overlap] = res
            gap = "n/a" if st.median_device_gap_s is None else f"{st.median_device_gap_s * 1e3:.2f} ms"
            print(
                f"{name:>8}: {len(res)} requests, {st.output_tokens} tokens, "
                f"{st.num_steps} steps, median device gap {gap}, KV ledger all free"
            )
    diff = first_difference(outcomes[False], outcomes[True])
    if diff is not None:
        print(f"FAIL: {diff}")
        return 1
    print("OK: serial and overlap agree on every token, finish reason and streamed text")
    return 0


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - convenience
    """``aserve verify`` as a function of its own."""
    parser = argparse.ArgumentParser(prog="aserve verify", description=__doc__)
    add_verify_args(parser)
    args = parser.parse_args(argv)
    configure_logging(args.log_format, logging.WARNING)
    try:
        sys.exit(anyio.run(run_verify, args))
    except AserveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


__all__ = ["EngineConfig", "WorkItem", "add_verify_args", "make_workload", "run_verify", "run_workload"]

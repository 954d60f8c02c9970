"""The ``aserve`` command: serve, generate, info, verify."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from aserve.config import add_engine_args, engine_config_from_args
from aserve.errors import AserveError
from aserve.logs import configure_logging

if TYPE_CHECKING:
    from aserve.tokenizer.base import Tokenizer


async def _generate(args: argparse.Namespace) -> int:
    from aserve.engine import Engine
    from aserve.sampling_params import SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed_request,
        stop=tuple(args.stop or ()),
    )
    async with Engine(engine_config_from_args(args)) as engine:
        prompt: str | list[int] = chat_prompt_ids(engine.tokenizer, args.prompt) if args.chat else args.prompt
        sys.stdout.write(args.prompt if not args.chat else "")
        sys.stdout.flush()
        async for delta in engine.generate(prompt, params):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            if delta.finish_reason:
                sys.stdout.write("\n")
                print(f"[finish_reason={delta.finish_reason}]", file=sys.stderr)
        if args.stats:
            print(json.dumps(engine.stats().as_dict(), indent=2), file=sys.stderr)
    return 0


def chat_prompt_ids(tokenizer: Tokenizer, content: str) -> list[int]:
    """One user turn laid out by the model's chat template, as token ids. The template's text
    starts with BOS already, so it is encoded without adding another (as the server's chat
    route does); a string prompt would get a second one."""
    from aserve.tokenizer.chat import apply_chat_template

    text = apply_chat_template(tokenizer, [{"role": "user", "content": content}])
    return tokenizer.encode(text, add_special_tokens=False)


async def _info(args: argparse.Namespace) -> int:
    from aserve.engine import Engine

    cfg = dataclasses.replace(engine_config_from_args(args), warmup=False)
    async with Engine(cfg) as engine:
        for k, v in engine.info().items():
            print(f"{k:>32}: {v}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and flag; builds without importing torch, so ``--help`` is quick."""
    parser = argparse.ArgumentParser(prog="aserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="stream a completion to the terminal")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default: %(default)s)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: %(default)s)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: %(default)s)")
    gen.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest, 0: all (default: %(default)s)")
    gen.add_argument("--seed-request", type=int, default=None, help="per-request sampling seed (default: --seed's)")
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--stats", action="store_true", help="print engine stats at the end")
    add_engine_args(gen)

    info = sub.add_parser("info", help="print model, device, dtype and KV capacity")
    add_engine_args(info)

    from aserve.verify import add_verify_args

    verify = sub.add_parser("verify", help="run a seeded workload serially and with overlap and compare")
    add_verify_args(verify)

    from aserve.server.command import add_serve_subcommand

    add_serve_subcommand(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Terminal commands print their own output; per-request log lines would interleave with it.
    quiet = args.command in ("generate", "info", "verify")
    configure_logging(getattr(args, "log_format", "console"), logging.WARNING if quiet else logging.INFO)
    try:
        if args.command == "generate":
            return anyio.run(_generate, args)
        if args.command == "info":
            return anyio.run(_info, args)
        if args.command == "serve":
            return int(args.handler(args))  # runs its own event loop (Hypercorn on asyncio)
        if args.command == "verify":
            from aserve.verify import run_verify

            return anyio.run(run_verify, args)
    except AserveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())

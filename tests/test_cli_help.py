"""`aserve --help` is quick (no torch import) and every flag of every subcommand says what it does."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from aserve.cli import build_parser
from aserve.config import FLAG_HELP, EngineConfig


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_flag_of_every_subcommand_has_help_text() -> None:
    subs = _subcommands(build_parser())
    assert set(subs) == {"generate", "info", "verify", "serve"}
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, sub in subs.items()
        for action in sub._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert missing == []


def test_every_engine_field_has_exactly_one_help_line() -> None:
    assert set(FLAG_HELP) == {f.name for f in fields(EngineConfig)}


def test_every_valued_flag_says_its_default() -> None:
    """A flag that takes a value names its default, or says in words what unset picks."""
    quiet = []
    for name, sub in _subcommands(build_parser()).items():
        for action in sub._actions:
            takes_value = action.nargs is None and action.option_strings and action.const is None
            if takes_value and "default" not in (action.help or "") and action.default is not None:
                quiet.append(f"{name} {action.option_strings}")
    assert quiet == []
    assert "(default: 8000)" in " ".join(_subcommands(build_parser())["serve"].format_help().split())


def test_help_does_not_import_torch() -> None:
    code = "import sys, aserve.cli as c; c.build_parser().format_help(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_generate_chat_prompt_has_one_bos(default_gguf: Path) -> None:
    """``aserve generate --chat`` lays the prompt out with the chat template, whose text starts
    with BOS: encoding it must not add a second one (a string prompt would)."""
    from aserve.cli import chat_prompt_ids
    from aserve.tokenizer.tokenizer import tokenizer_from_gguf

    tok = tokenizer_from_gguf(default_gguf)
    ids = chat_prompt_ids(tok, "Hi there")
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert "Hi there" in tok.decode(ids)

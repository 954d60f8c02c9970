"""Tokenization: sentencepiece tokenizer, streaming detokenizer, chat templates."""

from __future__ import annotations

from aserve.tokenizer.chat import apply_chat_template
from aserve.tokenizer.detokenizer import IncrementalDetokenizer
from aserve.tokenizer.tokenizer import Tokenizer

__all__ = ["IncrementalDetokenizer", "Tokenizer", "apply_chat_template"]

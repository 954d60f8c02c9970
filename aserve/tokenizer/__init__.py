"""Tokenization: one Tokenizer interface (sentencepiece or Hugging Face ``tokenizers`` behind it),
the streaming detokenizer and chat templates."""

from __future__ import annotations

from aserve.tokenizer.chat import apply_chat_template
from aserve.tokenizer.detokenizer import IncrementalDetokenizer
from aserve.tokenizer.tokenizer import ChatTemplate, Tokenizer

__all__ = ["ChatTemplate", "IncrementalDetokenizer", "Tokenizer", "apply_chat_template"]

"""Tokenization: one Tokenizer interface (sentencepiece or Hugging Face ``tokenizers`` behind it),
the streaming detokenizer and chat templates."""

from __future__ import annotations

from aserve.tokenizer.base import ChatTemplate, Tokenizer
from aserve.tokenizer.chat import apply_chat_template
from aserve.tokenizer.detokenizer import IncrementalDetokenizer
from aserve.tokenizer.loading import load_tokenizer, tokenizer_from_gguf, tokenizer_from_hf_dir

__all__ = [
    "ChatTemplate",
    "IncrementalDetokenizer",
    "Tokenizer",
    "apply_chat_template",
    "load_tokenizer",
    "tokenizer_from_gguf",
    "tokenizer_from_hf_dir",
]

"""The tokenizer interface and its loaders, in one place for the engine and the server."""

from __future__ import annotations

from aserve.tokenizer.base import ChatTemplate, Tokenizer
from aserve.tokenizer.loading import load_tokenizer, tokenizer_from_gguf, tokenizer_from_hf_dir

__all__ = ["ChatTemplate", "Tokenizer", "load_tokenizer", "tokenizer_from_gguf", "tokenizer_from_hf_dir"]

"""Hugging Face ``tokenizers`` backend: ``tokenizer.json`` files and GGUF byte-level BPE vocabularies."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache

import tokenizers

from aserve.tokenizer.base import ChatTemplate, Tokenizer


@cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: each of its 256 printable characters -> its byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            # Bytes that are not printable (controls, space, 0x7f-0xa0, 0xad) go to U+0100 and up.
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


class FastTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer``; BOS/EOS come from its post-processor, as in transformers.

    Special tokens are its added tokens marked special: they are matched whole in the text and
    dropped by ``decode(..., skip_special_tokens=True)``.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: Iterable[int],
        chat_template: ChatTemplate | None = None,
        source: str = "tokenizers",
    ) -> None:
        self._tok = backend
        self._size = backend.get_vocab_size(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
        self._added = {i: t.content for i, t in added.items()}
        decoder = backend.decoder
        self._byte_level = decoder is not None and b'"ByteLevel"' in decoder.__getstate__()
        self._finish_init(
            bos_token_id=bos_token_id,
            eos_token_ids=eos_token_ids,
            special_ids=[i for i, t in added.items() if t.special],
            chat_template=chat_template,
            source=source,
        )

    @property
    def backend(self) -> tokenizers.Tokenizer:
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._size

    def id_to_piece(self, token_id: int) -> str:
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            raise IndexError(f"token id {token_id} is outside the vocabulary of {self._size}")
        return str(piece)

    def piece_to_id(self, piece: str) -> int | None:
        i = self._tok.token_to_id(piece)
        return None if i is None else int(i)

    def token_text(self, token_id: int) -> str:
        piece = self.id_to_piece(token_id)
        if token_id in self._added or not self._byte_level:
            return piece.replace("\u2581", " ")
        table = byte_decoder()
        if not all(c in table for c in piece):
            return piece
        return bytes(table[c] for c in piece).decode("utf-8", errors="replace")

    def piece_bytes(self, token_id: int) -> bytes:
        table = byte_decoder()
        piece = self.id_to_piece(token_id)
        if self._byte_level and token_id not in self._added and all(c in table for c in piece):
            return bytes(table[c] for c in piece)  # byte-level BPE: one char per byte
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])  # a sentencepiece-style byte fallback
        return piece.replace("\u2581", " ").encode()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

"""Incremental detokenization for streaming: emit only new, complete text."""

from __future__ import annotations

from collections.abc import Sequence

from aserve.tokenizer.base import Tokenizer

_REPLACEMENT = "\ufffd"
_WINDOW = 16  # tokens the decode window may hold before its start moves up


class IncrementalDetokenizer:
    """Turn a growing id sequence into text deltas without re-decoding the whole sequence.

    Like vLLM, it decodes only a window: ids[prefix:] minus ids[prefix:read]. ``prefix`` always
    sits on a character boundary and the window is never empty, so per-token effects of a full
    decode (a stripped leading space, byte-fallback pieces) come out the same as decoding it all.

    Unlike vLLM, ``prefix`` stays put for up to ``_WINDOW`` tokens: the text of
    ids[prefix:read] is then the previous push's full window, kept, so a push costs one decode
    instead of two (measured: ~10 µs per token before, on the default model's vocabulary).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window
        self._read = 0  # ids before this are already emitted
        self._parts: list[str] = []
        self._prefix_text: str | None = ""  # decode of ids[prefix:read] when known

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    @property
    def token_ids(self) -> list[int]:
        return self._ids

    def push(self, ids: Sequence[int]) -> str:
        """Add ``ids``; return the text they complete (possibly empty while bytes are pending)."""
        tok = self._tok
        if self._skip:
            # decode() drops special ids anyway; dropping them here keeps windows small and aligned.
            ids = [i for i in ids if not tok.is_special(i)]
        if not ids:
            return ""
        self._ids.extend(ids)
        prefix_text, full_text = self._window_texts()
        # A trailing U+FFFD may be a character whose remaining bytes have not arrived yet.
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""
        delta = full_text[len(prefix_text) :]
        self._advance(full_text)
        self._parts.append(delta)
        return delta

    def _window_texts(self) -> tuple[str, str]:
        """(text of ids[prefix:read], text of ids[prefix:]); the first is kept between pushes."""
        prefix_text = self._prefix_text
        if prefix_text is None:
            prefix_text = self._prefix_text = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        return prefix_text, self._tok.decode(self._ids[self._prefix :], self._skip)

    def _advance(self, full_text: str) -> None:
        """Everything pushed is emitted: ``read`` moves to the end; ``prefix`` moves up to the
        old ``read`` (a character boundary) only once the window grew past ``_WINDOW``."""
        if len(self._ids) - self._prefix > _WINDOW:
            self._prefix, self._prefix_text = self._read, None
        else:
            self._prefix_text = full_text
        self._read = len(self._ids)

    def flush(self) -> str:
        """Emit what is held back at the end (an unfinished UTF-8 sequence becomes U+FFFD)."""
        prefix_text, full_text = self._window_texts()
        delta = full_text[len(prefix_text) :]
        if delta:
            self._advance(full_text)
            self._parts.append(delta)
        return delta

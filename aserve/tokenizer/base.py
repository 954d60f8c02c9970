"""The one tokenizer interface the engine, the server and the commit point use.

Two backends sit behind it: ``SentencePieceTokenizer`` (``spm.py``; GGUF ``llama`` vocabularies
and ``tokenizer.model`` files) and ``FastTokenizer`` (``fast.py``; Hugging Face ``tokenizers``:
``tokenizer.json`` files and GGUF ``gpt2`` byte-level BPE vocabularies). ``load_tokenizer``
(``loading.py``) picks the backend from what the model path holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Pieces that end an assistant turn in chat models; generation must stop on them as well as EOS.
_END_OF_TURN_PIECES = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|eom_id|>")


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and where it was found (for ``aserve info`` and logs)."""

    text: str
    source: str


class Tokenizer(ABC):
    """Encode text to ids and decode ids to text; mirrors transformers' tokenizer for the model.

    Subclasses set up their backend, then call ``_finish_init`` with the special-token facts.
    """

    _bos: int | None
    _eos: tuple[int, ...]
    _special: frozenset[int]
    _template: ChatTemplate | None
    _source: str

    def _finish_init(
        self,
        *,
        bos_token_id: int | None,
        eos_token_ids: Iterable[int],
        special_ids: Iterable[int],
        chat_template: ChatTemplate | None,
        source: str,
    ) -> None:
        n = self.vocab_size
        self._bos = bos_token_id if bos_token_id is not None and 0 <= bos_token_id < n else None
        eos = list(dict.fromkeys(i for i in eos_token_ids if 0 <= i < n))
        for piece in _END_OF_TURN_PIECES:
            pid = self.piece_to_id(piece)
            if pid is not None and pid not in eos:
                eos.append(pid)
        self._eos = tuple(eos)
        self._special = frozenset(special_ids)
        self._template = chat_template
        self._source = source

    # ---- properties ---------------------------------------------------------------------

    @property
    def bos_token_id(self) -> int | None:
        return self._bos

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation: the model's EOS plus end-of-turn pieces of chat models."""
        return self._eos

    @property
    def chat_template(self) -> str | None:
        return self._template.text if self._template is not None else None

    @property
    def chat_template_source(self) -> str | None:
        """Where the chat template came from, e.g. ``"tokenizer_config.json"``; None without one."""
        return self._template.source if self._template is not None else None

    @property
    def source(self) -> str:
        """Which backend and which file(s), e.g. ``"tokenizers: tokenizer.json"``."""
        return self._source

    def is_special(self, token_id: int) -> bool:
        """True for ids ``decode(..., skip_special_tokens=True)`` drops."""
        return token_id in self._special

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows (added tokens included)."""

    @abstractmethod
    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary entry of ``token_id`` as the tokenizer spells it (``▁x``, ``Ġx``, ``<0x0A>``)."""

    @abstractmethod
    def piece_to_id(self, piece: str) -> int | None:
        """The id of a vocabulary entry spelled as ``id_to_piece`` spells it; None if absent."""

    @abstractmethod
    def token_text(self, token_id: int) -> str:
        """One token's own text for logprobs (leading space kept, bytes of a split character
        shown as U+FFFD); concatenated, these need not equal ``decode``."""

    @abstractmethod
    def piece_bytes(self, token_id: int) -> bytes:
        """One id's bytes as they appear in decoded text (a byte-fallback piece is its byte,
        ``▁`` a space); a special token keeps its text (``is_special`` tells them apart)."""

    def token_bytes(self) -> list[bytes]:
        """Every id's :meth:`piece_bytes` (what a grammar engine matches against)."""
        return [self.piece_bytes(i) for i in range(self.vocab_size)]

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids for ``text``; ``add_special_tokens`` adds BOS (and EOS) where the model wants them.
        Special tokens written in the text (``<|im_end|>``) are matched whole."""

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text for ``ids``; special tokens are dropped when ``skip_special_tokens``. Bytes of an
        unfinished UTF-8 character come out as U+FFFD."""

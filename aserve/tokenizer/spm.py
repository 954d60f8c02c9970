"""Sentencepiece backend: GGUF ``llama`` vocabularies and ``tokenizer.model`` files."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sentencepiece as spm

from aserve.tokenizer.base import ChatTemplate, Tokenizer
from aserve.tokenizer.gguf_proto import CONTROL, UNKNOWN, USER_DEFINED, ModelProto, sp_pb2


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece model; control pieces are special (matched whole in text, skipped in decode)."""

    def __init__(
        self,
        proto: ModelProto,
        *,
        bos_token_id: int | None,
        eos_token_ids: Iterable[int],
        add_bos: bool = True,
        chat_template: ChatTemplate | None = None,
        source: str = "sentencepiece",
    ) -> None:
        proto = sp_pb2.ModelProto.FromString(proto.SerializeToString())
        self._pieces = [p.piece for p in proto.pieces]
        self._piece_ids: dict[str, int] | None = None
        special: set[int] = set()
        unk_id: int | None = None
        for i, p in enumerate(proto.pieces):
            if p.type == CONTROL:
                # transformers matches control tokens whole in the input text (as special added
                # tokens); sentencepiece only does that for user-defined pieces, so switch them.
                special.add(i)
                p.type = USER_DEFINED  # type: ignore[assignment]
            elif p.type == UNKNOWN:
                special.add(i)
                unk_id = i
        self._unk_id = unk_id
        self._unk_piece = self._pieces[unk_id] if unk_id is not None else None
        self._sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        self._add_bos = add_bos and bos_token_id is not None
        self._finish_init(
            bos_token_id=bos_token_id,
            eos_token_ids=eos_token_ids,
            special_ids=special,
            chat_template=chat_template,
            source=source,
        )

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    def id_to_piece(self, token_id: int) -> str:
        return self._pieces[token_id]

    def piece_to_id(self, piece: str) -> int | None:
        if self._piece_ids is None:
            self._piece_ids = {p: i for i, p in enumerate(self._pieces)}
        return self._piece_ids.get(piece)

    def token_text(self, token_id: int) -> str:
        # The piece, not decode([id]): sentencepiece's decode drops a leading space.
        return self._pieces[token_id].replace("\u2581", " ")

    def piece_bytes(self, token_id: int) -> bytes:
        p = self._pieces[token_id]
        return bytes([int(p[3:5], 16)]) if self._sp.IsByte(token_id) else p.replace("\u2581", " ").encode()

    # ---- encode / decode ----------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids for ``text``; ``add_special_tokens`` prepends BOS when the model wants it."""
        ids: list[int] = [self._bos] if add_special_tokens and self._add_bos and self._bos is not None else []
        if self._unk_piece is not None and self._unk_piece in text:
            # The unknown piece cannot also be user-defined, so match it whole here.
            parts = text.split(self._unk_piece)
            for k, part in enumerate(parts):
                if k:
                    ids.append(self._unk_id)  # type: ignore[arg-type]
                if part:
                    ids.extend(self._sp.EncodeAsIds(part))
            return ids
        ids.extend(self._sp.EncodeAsIds(text))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text for ``ids``; control tokens are dropped when ``skip_special_tokens``."""
        if skip_special_tokens:
            if not self._special.isdisjoint(ids):
                ids = [i for i in ids if i not in self._special]
        elif self._unk_id is not None and self._unk_id in ids:
            # sentencepiece renders the unknown id as " ⁇ "; transformers prints its piece.
            out: list[str] = []
            start = 0
            for k, i in enumerate(ids):
                if i == self._unk_id:
                    out.append(self._sp.DecodeIds(list(ids[start:k])) + self._pieces[i])
                    start = k + 1
            out.append(self._sp.DecodeIds(list(ids[start:])))
            return "".join(out)
        return str(self._sp.DecodeIds(list(ids)))

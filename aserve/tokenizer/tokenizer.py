"""Sentencepiece tokenizer built from a GGUF vocabulary or a Hugging Face model directory."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from aserve.errors import ModelLoadError, ModelNotFoundError
from aserve.tokenizer.gguf_proto import (
    CONTROL,
    UNKNOWN,
    USER_DEFINED,
    ModelProto,
    proto_from_gguf,
    read_gguf_metadata,
    sp_pb2,
)

# Pieces that end an assistant turn in chat models; generation must stop on them as well as EOS.
_END_OF_TURN_PIECES = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>")


class Tokenizer:
    """Encode text to ids and decode ids to text; mirrors transformers' tokenizer for the model."""

    def __init__(
        self,
        proto: ModelProto,
        *,
        bos_token_id: int | None,
        eos_token_ids: Iterable[int],
        add_bos: bool = True,
        chat_template: str | None = None,
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
        self._special = frozenset(special)
        self._unk_id = unk_id
        self._unk_piece = self._pieces[unk_id] if unk_id is not None else None
        self._sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        self._bos = bos_token_id
        self._add_bos = add_bos and bos_token_id is not None
        eos = [i for i in eos_token_ids if 0 <= i < len(self._pieces)]
        for piece in _END_OF_TURN_PIECES:
            pid = self.piece_to_id(piece)
            if pid is not None and pid not in eos:
                eos.append(pid)
        self._eos = tuple(eos)
        self._chat_template = chat_template

    # ---- constructors -------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """Rebuild the tokenizer from a GGUF file's ``tokenizer.ggml.*`` metadata."""
        path = Path(path)
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {path} does not exist")
        meta = read_gguf_metadata(path)
        proto, special = proto_from_gguf(meta)
        template = meta.get("tokenizer.chat_template")
        return cls(
            proto,
            bos_token_id=special.bos,
            eos_token_ids=[special.eos] if special.eos is not None else [],
            add_bos=special.add_bos,
            chat_template=template if isinstance(template, str) else None,
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.model`` plus BOS/EOS/chat template from a Hugging Face directory."""
        root = Path(path)
        model_file = root / "tokenizer.model"
        if not model_file.is_file():
            raise ModelNotFoundError(f"{root} has no tokenizer.model (sentencepiece) file")
        try:
            proto = sp_pb2.ModelProto.FromString(model_file.read_bytes())
        except Exception as exc:  # protobuf raises its own DecodeError type
            raise ModelLoadError(f"{model_file} is not a sentencepiece model: {exc}") from exc
        tok_cfg = _read_json(root / "tokenizer_config.json")
        pieces = {p.piece: i for i, p in enumerate(proto.pieces)}
        spec = proto.trainer_spec
        bos: int | None = spec.bos_id if spec.bos_id >= 0 else None
        eos: list[int] = [spec.eos_id] if spec.eos_id >= 0 else []
        # Later files win: generation_config.json is what HF generation actually stops on.
        for cfg in (
            _read_json(root / "config.json"),
            tok_cfg,
            _read_json(root / "generation_config.json"),
        ):
            bos_ids = _token_ids(cfg.get("bos_token_id"), pieces)
            bos = bos_ids[0] if bos_ids else bos
            if cfg.get("eos_token_id") is not None:
                eos = _token_ids(cfg["eos_token_id"], pieces)
        for key, value in (
            ("bos_token", tok_cfg.get("bos_token")),
            ("eos_token", tok_cfg.get("eos_token")),
        ):
            ids = _token_ids(value, pieces)
            if ids and key == "bos_token":
                bos = ids[0]
            elif ids and ids[0] not in eos:
                eos.insert(0, ids[0])
        template = tok_cfg.get("chat_template")
        if isinstance(template, list):  # several named templates: use the default one
            template = next(
                (t.get("template") for t in template if t.get("name") == "default"),
                None,
            )
        return cls(
            proto,
            bos_token_id=bos,
            eos_token_ids=eos,
            add_bos=bool(tok_cfg.get("add_bos_token", True)),
            chat_template=template if isinstance(template, str) else None,
        )

    # ---- properties ---------------------------------------------------------------------

    @property
    def bos_token_id(self) -> int | None:
        return self._bos

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def id_to_piece(self, token_id: int) -> str:
        return self._pieces[token_id]

    def piece_to_id(self, piece: str) -> int | None:
        if self._piece_ids is None:
            self._piece_ids = {p: i for i, p in enumerate(self._pieces)}
        return self._piece_ids.get(piece)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def token_bytes(self) -> list[bytes]:
        """Each id's bytes as it appears in decoded text (what a grammar engine matches):
        ``▁`` is a space, a byte-fallback piece ``<0x0A>`` its byte; special tokens keep their
        text (the engine must treat them as special, see ``is_special``)."""
        out: list[bytes] = []
        for i, piece in enumerate(self._pieces):
            if self._sp.IsByte(i):
                out.append(bytes([int(piece[3:5], 16)]))
            else:
                out.append(piece.replace("\u2581", " ").encode())
        return out

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


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot parse {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_ids(value: Any, pieces: dict[str, int]) -> list[int]:
    """Ids from a config value: an int, a list of ints, a token string or an AddedToken dict."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [i for v in value for i in _token_ids(v, pieces)]
    if isinstance(value, dict):
        return _token_ids(value.get("content"), pieces)
    if isinstance(value, str) and value in pieces:
        return [pieces[value]]
    return []

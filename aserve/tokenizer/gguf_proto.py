"""Read GGUF tokenizer metadata and rebuild a sentencepiece ModelProto from it."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from sentencepiece import sentencepiece_model_pb2 as _pb2

from aserve.errors import ModelLoadError

# The protobuf module builds its classes at import time, so mypy cannot see them.
sp_pb2: Any = _pb2
ModelProto: TypeAlias = Any

# GGUF value type codes (same numbering as gguf.GGUFValueType).
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9

# GGUF token types; sentencepiece uses the same numbers in ModelProto.SentencePiece.Type.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


class _Cursor:
    """Little-endian reader over a memory map; only the metadata section is touched."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, count = self.scalar("<I"), self.scalar("<Q")
            if itype in _SCALARS:
                # Bulk-unpack numeric arrays: per-item loops dominate load time otherwise.
                fmt = _SCALARS[itype]
                size = struct.calcsize(fmt)
                values = list(struct.unpack_from(f"<{count}{fmt[1]}", self.buf, self.pos))
                self.pos += size * count
                return values
            return [self.value(itype) for _ in range(count)]
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        raise ModelLoadError(f"GGUF metadata has unknown value type {vtype} at byte {self.pos}")


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Return the GGUF key/value metadata without reading tensors.

    ``gguf.GGUFReader`` maps every tensor too, which takes seconds on a cold cache; the tokenizer
    only needs the header, so this parses just that part.
    """
    try:
        with (
            open(path, "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf,
        ):
            cur = _Cursor(buf)
            if buf[:4] != b"GGUF":
                raise ModelLoadError(f"{path} is not a GGUF file (bad magic {buf[:4]!r})")
            cur.pos = 4
            version = cur.scalar("<I")
            if version < 2:
                raise ModelLoadError(f"{path}: GGUF version {version} is unsupported; re-convert it")
            cur.scalar("<Q")  # tensor count
            n_kv = cur.scalar("<Q")
            meta: dict[str, Any] = {}
            for _ in range(n_kv):
                key = cur.string()
                meta[key] = cur.value(cur.scalar("<I"))
            return meta
    except (OSError, struct.error, ValueError) as exc:
        raise ModelLoadError(f"cannot read GGUF metadata from {path}: {exc}") from exc


@dataclass(frozen=True)
class SpecialTokens:
    """Special token ids found in the metadata (``None`` where absent)."""

    bos: int | None
    eos: int | None
    unk: int | None
    pad: int | None
    add_bos: bool
    add_eos: bool


def proto_from_gguf(meta: dict[str, Any]) -> tuple[ModelProto, SpecialTokens]:
    """Build a BPE sentencepiece ModelProto equivalent to the GGUF "llama" (SPM) vocabulary."""
    model = meta.get("tokenizer.ggml.model")
    if model != "llama":
        raise ModelLoadError(f"tokenizer.ggml.model={model!r} is unsupported; only SPM ('llama') is")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    n = len(tokens)
    scores: list[float] = meta.get("tokenizer.ggml.scores") or [0.0] * n
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [NORMAL] * n
    arch = str(meta.get("general.architecture", ""))

    def _id(key: str) -> int | None:
        value = meta.get(f"tokenizer.ggml.{key}")
        return int(value) if value is not None and 0 <= int(value) < n else None

    special = SpecialTokens(
        bos=_id("bos_token_id"),
        eos=_id("eos_token_id"),
        unk=_id("unknown_token_id"),
        pad=_id("padding_token_id"),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    )
    gemma = arch.startswith("gemma")
    proto = sp_pb2.ModelProto()
    for i, (piece, score, ttype) in enumerate(zip(tokens, scores, types, strict=True)):
        if gemma and piece and " " in piece and not piece.strip():
            # Gemma files store runs of spaces as real spaces; the model learned them as "▁▁..."
            # merges (transformers respells them the same way), so they are normal pieces.
            piece, ttype = "\u2581" * len(piece), NORMAL
        if ttype not in (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE):
            ttype = NORMAL
        if i == special.unk:
            ttype = UNKNOWN
        elif ttype == UNKNOWN:
            ttype = CONTROL  # sentencepiece allows exactly one unknown piece
        sp = proto.pieces.add()
        sp.piece = piece
        # Gemma's merge priority is file order (transformers uses -index too); elsewhere the score.
        sp.score = float(-i) if gemma and ttype == NORMAL else float(score)
        sp.type = ttype  # type: ignore[assignment]
    if special.unk is None:
        raise ModelLoadError("GGUF vocabulary has no unknown token (tokenizer.ggml.unknown_token_id)")
    ts = proto.trainer_spec
    ts.model_type = sp_pb2.TrainerSpec.BPE
    ts.vocab_size = n
    ts.byte_fallback = BYTE in types
    ts.unk_id = special.unk
    ts.bos_id = special.bos if special.bos is not None else -1
    ts.eos_id = special.eos if special.eos is not None else -1
    ts.pad_id = special.pad if special.pad is not None else -1
    ns = proto.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", not gemma))
    ns.remove_extra_whitespaces = bool(meta.get("tokenizer.ggml.remove_extra_whitespaces", False))
    ns.escape_whitespaces = True
    return proto, special

"""A sentencepiece BPE model as a Hugging Face ``tokenizers`` JSON, for consumers that tokenize
in native code (llguidance's grammar engine: ``aserve/sampling/grammar.py``).

The merges come from the pieces' scores, as transformers' sentencepiece converter makes
them: every split of a piece into two pieces is a merge, ranked by the piece's score. Pieces
the model matches whole (user-defined: Gemma's whitespace runs and HTML tags) stay plain
vocabulary entries with their merges rather than added tokens, because llguidance treats
every added token as special, which would take them out of the grammar's alphabet. Special
(control and unknown) pieces are added tokens marked special.

The result encodes like sentencepiece except where a user-defined piece sits in the text (an
HTML tag, a run of whitespace after other text): llguidance only tokenizes the short
fragments a grammar forces with it, and any split of the same bytes is a valid one.
"""

from __future__ import annotations

import functools

from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as HFTokenizer

from aserve.tokenizer.gguf_proto import NORMAL, USER_DEFINED

SPACE = "\u2581"


@functools.lru_cache(maxsize=2)  # engines made one after another in a process share the work (~2 s for Gemma)
def spm_bpe_to_json(
    pieces: tuple[str, ...],
    scores: tuple[float, ...],
    types: tuple[int, ...],
    special: frozenset[int],
    unk_id: int | None,
) -> str:
    """``tokenizers`` JSON for a sentencepiece BPE vocabulary with byte fallback (no dummy prefix)."""
    vocab: dict[str, int] = {}
    for i, p in enumerate(pieces):
        vocab.setdefault(p, i)
    ranked: list[tuple[float, int, str, str]] = []
    for i, p in enumerate(pieces):
        if len(p) < 2 or i in special or types[i] not in (NORMAL, USER_DEFINED):
            continue
        splits = [(p[:k], p[k:]) for k in range(1, len(p)) if p[:k] in vocab and p[k:] in vocab]
        splits.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        ranked.extend((scores[i], i, left, right) for left, right in splits)
    ranked.sort(key=lambda m: (-m[0], m[1]))
    bpe = models.BPE(
        vocab=vocab,
        merges=[(left, right) for _, _, left, right in ranked],
        byte_fallback=True,
        unk_token=pieces[unk_id] if unk_id is not None else None,
        fuse_unk=True,
    )
    tok = HFTokenizer(bpe)
    tok.normalizer = normalizers.Replace(" ", SPACE)  # type: ignore[assignment]
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])  # type: ignore[assignment]
    tok.add_special_tokens([AddedToken(pieces[i], normalized=False, special=True) for i in sorted(special)])
    return str(tok.to_str())

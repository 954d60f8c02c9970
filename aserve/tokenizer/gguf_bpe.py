"""Rebuild a GGUF ``gpt2`` (byte-level BPE) vocabulary as a Hugging Face ``tokenizers`` object.

A GGUF stores no ``tokenizer.json``: only the tokens, the merges, a type per token and the name
of the pre-tokenizer (``tokenizer.ggml.pre``) that llama.cpp maps to its own split rules. The
rules per name follow llama.cpp's ``llama-vocab.cpp`` (which regexes, ``ignore_merges``, whether
BOS is added when the file does not say); the names map to the pre-tokenizers the models'
own ``tokenizer.json`` files use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from aserve.errors import ModelLoadError
from aserve.logs import get_logger
from aserve.tokenizer.fast import byte_decoder
from aserve.tokenizer.gguf_proto import CONTROL, USER_DEFINED

log = get_logger("aserve.tokenizer")

# Llama 3's split: case-insensitive contractions, letters with one leading non-letter, numbers in
# runs of at most three digits, punctuation runs with trailing newlines, newline runs, spaces.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's: the same shape, but every digit is a piece of its own.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizerRule:
    split: str | None  # a regex split before the byte-level step; None: GPT-2's own regex
    individual_digits: bool = False  # split digits apart before GPT-2's regex (SmolLM)
    ignore_merges: bool = False  # a word that is itself a token is not merged (tiktoken-style)
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token key


_LLAMA3 = PreTokenizerRule(_LLAMA3_SPLIT, ignore_merges=True, add_bos=True)
_QWEN2 = PreTokenizerRule(_QWEN2_SPLIT)
_GPT2 = PreTokenizerRule(None)

PRE_TOKENIZERS: dict[str, PreTokenizerRule] = {
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
    "smollm": PreTokenizerRule(None, individual_digits=True),
    "gpt-2": _GPT2,
    "gpt2": _GPT2,
}


def _pre_tokenizer(rule: PreTokenizerRule) -> pre_tokenizers.PreTokenizer:
    if rule.split is not None:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(rule.split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    if rule.individual_digits:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


@dataclass(frozen=True)
class GGUFVocab:
    """A GGUF byte-level vocabulary as a ``tokenizers`` object plus what it says about BOS/EOS."""

    backend: HFTokenizer
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pre: str


def bpe_from_gguf(meta: dict[str, Any]) -> GGUFVocab:
    """Convert ``tokenizer.ggml.*`` metadata of a ``gpt2`` vocabulary."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ModelLoadError(f"tokenizer.ggml.model={meta.get('tokenizer.ggml.model')!r} is not a gpt2 vocabulary")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges_raw: list[str] | None = meta.get("tokenizer.ggml.merges")
    if not merges_raw:
        raise ModelLoadError("GGUF gpt2 vocabulary has no tokenizer.ggml.merges")
    n = len(tokens)
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * n
    pre = str(meta.get("tokenizer.ggml.pre") or "default")
    rule = PRE_TOKENIZERS.get(pre)
    if rule is None:
        if pre != "default":
            raise ModelLoadError(
                f"GGUF pre-tokenizer {pre!r} is unsupported; supported: {', '.join(sorted(PRE_TOKENIZERS))}"
            )
        log.warning("gguf_pre_tokenizer_missing", hint="tokenizer.ggml.pre is absent; splitting with GPT-2's regex")
        rule = _GPT2

    alphabet = byte_decoder()
    to_char = {b: c for c, b in alphabet.items()}

    def spelled(token: str) -> str:
        # Merges and ordinary tokens are written in the byte alphabet; some converters store
        # added tokens raw (a real space, a non-Latin-1 character): respell those byte by byte.
        return token if all(c in alphabet for c in token) else "".join(to_char[b] for b in token.encode("utf-8"))

    vocab = {spelled(t): i for i, t in enumerate(tokens)}
    merges: list[tuple[str, str]] = []
    for m in merges_raw:
        left, sep, right = m.partition(" ")
        if not sep:
            raise ModelLoadError(f"GGUF merge {m!r} is not two tokens separated by a space")
        merges.append((left, right))
    backend = HFTokenizer(
        models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=rule.ignore_merges)
    )
    backend.pre_tokenizer = _pre_tokenizer(rule)
    backend.decoder = decoders.ByteLevel()

    def token_id(key: str) -> int | None:
        value = meta.get(f"tokenizer.ggml.{key}")
        return int(value) if value is not None and 0 <= int(value) < n else None

    bos, eos = token_id("bos_token_id"), token_id("eos_token_id")
    named = [i for i in (bos, eos, token_id("unknown_token_id"), token_id("padding_token_id")) if i is not None]
    # Control tokens (and the named ones) are special: matched whole, skipped when decoding.
    # A control token outside the byte alphabet is a converter's mislabel (transformers skips
    # those too): it would become a new id past the model's vocabulary.
    special = [
        i
        for i, (t, ty) in enumerate(zip(tokens, types, strict=True))
        if (ty == CONTROL or i in named) and all(c in alphabet for c in t)
    ]
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special])
    user = [t for t, ty in zip(tokens, types, strict=True) if ty == USER_DEFINED and all(c in alphabet for c in t)]
    if user:  # llama.cpp matches user-defined tokens (``<think>``) whole in the text too
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", rule.add_bos)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    head = [tokens[bos]] if add_bos and bos is not None else []
    tail = [tokens[eos]] if add_eos and eos is not None else []
    marks = [(tokens[i], i) for i in (bos if head else None, eos if tail else None) if i is not None]
    backend.post_processor = processors.TemplateProcessing(
        single=[*head, "$A", *tail], pair=[*head, "$A", *tail, "$B:1"], special_tokens=marks
    )

    eos_ids = [i for i in (eos, token_id("eot_token_id"), token_id("eom_token_id")) if i is not None]
    return GGUFVocab(backend, bos, tuple(dict.fromkeys(eos_ids)), pre)

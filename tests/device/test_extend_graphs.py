"""The prefill graphs' rungs: token counts and sequence bounds (pure host, no model run)."""

from __future__ import annotations

import pytest
import torch

from aserve.bench.host_step import _CFG
from aserve.device.extend_graphs import ExtendGraphs, token_ladder
from aserve.kv.pool import KVPool


def test_token_ladder() -> None:
    assert token_ladder(8192) == [16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
    assert token_ladder(48) == [16, 32, 48]
    assert token_ladder(255)[-2:] == [192, 256]  # the budget itself, rounded up to even
    assert token_ladder(10) == [10]


@pytest.mark.parametrize(("max_tokens", "max_seqs"), [(8192, 256), (255, 256), (15, 64), (47, 5), (1000, 7), (9, 9)])
def test_every_rung_holds_its_sequences_in_its_tokens(max_tokens: int, max_seqs: int) -> None:
    """Each rung's sequence bound is even (the packed fields after it stay 16-byte aligned),
    at least min(tokens, max_seqs) (every step that fits the tokens fits the sequences: a
    sequence has a token at least) and at most its tokens: the decode kernel of a mixed step
    runs one program per sequence slot over q's first rows."""
    pool = KVPool(_CFG, num_pages=8, page_size=16, num_rows=4, max_context=64, dtype=torch.float32,
                  device=torch.device("cpu"))  # fmt: skip
    graphs = ExtendGraphs(torch.nn.Identity(), pool, torch.device("cpu"), max_tokens, max_seqs, _CFG.vocab_size)
    rungs = list(graphs._static.values())
    assert rungs[-1].tokens >= max_tokens
    for s in rungs:
        assert s.seqs % 2 == 0 and min(s.tokens, max_seqs) <= s.seqs <= s.tokens
        assert s.inputs.shape[0] == 3 * s.tokens + 4 * s.seqs
    # A step of every size up to the budget finds a rung, with as many sequences as it may hold.
    for t in range(1, max_tokens + 1):
        got = graphs.host_inputs([0] * t, [0] * t, [0] * t, [0] * min(t, max_seqs), [0] * min(t, max_seqs),
                                 [1] * min(t, max_seqs), [0] * min(t, max_seqs))  # fmt: skip
        assert got is not None, t

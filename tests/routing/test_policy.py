"""The routing policies and the prefix index: plain data, no Ray, no model."""

from __future__ import annotations

import pytest

from aserve.routing.policy import Balance, LeastLoaded, PrefixAffinity, RoundRobin, make_policy
from aserve.routing.prefix import PrefixIndex, block_hashes, route_prompt

IDLE = {"a": 0, "b": 0, "c": 0}


def test_block_hashes_share_exactly_the_shared_blocks() -> None:
    base = list(range(100, 164))  # 4 blocks of 16
    other = base[:40] + [7] * 24  # diverges inside block 2 (tokens 32..47)
    h1, h2 = block_hashes(base, 16), block_hashes(other, 16)
    assert len(h1) == 4 and len(h2) == 4
    assert h1[:2] == h2[:2] and h1[2] != h2[2] and h1[3] != h2[3]
    assert block_hashes(base[:47], 16) == h1[:2]  # a partial block is left out
    assert block_hashes("x" * 64, 16) == block_hashes("x" * 64 + "y", 16) != block_hashes("y" * 64, 16)


def test_route_prompt_reads_every_body_shape() -> None:
    assert route_prompt({"prompt": "hello"}) == "hello"
    assert route_prompt({"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert route_prompt({"prompt": [[4, 5], [6]]}) == [4, 5]
    assert route_prompt({"prompt": ["first", "second"]}) == "first"
    chat = route_prompt(
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "Q"}]}]}
    )
    assert chat == "system\nS\nuser\nQ\n"
    assert route_prompt({"prompt": []}) is None and route_prompt([1]) is None and route_prompt({}) is None


def test_index_matches_the_longest_prefix_and_evicts_tails_first() -> None:
    idx = PrefixIndex()
    shared = block_hashes(list(range(64)), 16)
    idx.insert("a", shared)
    idx.insert("b", shared[:2])
    assert idx.match(shared, ["a", "b", "c"]) == {"a": 4, "b": 2}
    idx.set_capacity("a", 2)  # keeps the root blocks, drops the tail
    assert idx.match(shared, ["a"]) == {"a": 2}
    idx.forget("b")
    assert idx.match(shared, ["b"]) == {}


def test_prefix_affinity_keeps_a_prefix_on_one_replica_and_spreads_new_ones() -> None:
    p = PrefixAffinity()
    groups = [block_hashes([g] * 16 * 4, 16) for g in range(1, 4)]
    first = []
    for blocks in groups:
        r = p.choose(blocks, IDLE)[0]
        p.routed(r, blocks)
        first.append(r)
    assert sorted(first) == ["a", "b", "c"]  # three new prefixes, three replicas
    for g, blocks in enumerate(groups):
        for _ in range(3):
            r = p.choose(blocks + block_hashes([99] * 16, 16), IDLE)[0]
            p.routed(r, blocks)
            assert r == first[g]


def test_prefix_affinity_leaves_a_much_busier_replica() -> None:
    p = PrefixAffinity(Balance(abs=8, rel=1.5))
    blocks = block_hashes(list(range(64)), 16)
    p.routed("a", blocks)
    assert p.choose(blocks, {"a": 9, "b": 2})[0] == "a"  # 7 more: not much busier
    assert p.choose(blocks, {"a": 11, "b": 2})[0] == "b"  # 9 more and 5.5x: much busier
    assert p.choose(blocks, {"a": 40, "b": 30})[0] == "a"  # 10 more but only 1.3x
    assert p.num_balanced == 1


def test_round_robin_and_least_loaded() -> None:
    rr = RoundRobin()
    assert [rr.choose([], IDLE)[0] for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    ll = LeastLoaded()
    assert ll.choose([], {"a": 3, "b": 1, "c": 2}) == ["b", "c", "a"]
    assert {ll.choose([], IDLE)[0] for _ in range(3)} == {"a", "b", "c"}  # ties rotate
    with pytest.raises(ValueError, match="round-robin"):
        make_policy("random")

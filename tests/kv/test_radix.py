"""The radix tree on its own: page-aligned matching, splitting, duplicates, locks, LRU eviction."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aserve.kv.radix import RadixCache


def test_match_is_page_aligned_and_splits_edges() -> None:
    t = RadixCache(page_size=2)
    _node, dups = t.insert([1, 2, 3, 4, 5, 6, 7], [10, 11, 12, 13])  # 3 full pages; the 4th page is partial
    assert dups == [] and t.num_pages == 3
    assert t.match([1, 2, 3, 4, 5, 6, 7, 8]).pages == [10, 11, 12]
    assert t.match([1, 2, 3, 9]).pages == [10]  # diverges inside page 2: page 1 only
    m = t.match([1, 2, 3, 4, 0, 0])
    assert m.pages == [10, 11]
    # The edge was split at the match point; both halves are still found.
    assert t.match([1, 2, 3, 4, 5, 6]).pages == [10, 11, 12]
    assert t.num_pages == 3


def test_insert_returns_duplicates_and_keeps_the_trees_pages() -> None:
    t = RadixCache(page_size=2)
    t.insert([1, 2, 3, 4], [10, 11])
    _, dups = t.insert([1, 2, 3, 4, 5, 6], [20, 21, 22])  # same prefix computed again elsewhere
    assert dups == [20, 21]
    assert t.match([1, 2, 3, 4, 5, 6]).pages == [10, 11, 22]
    assert t.num_pages == 3


def test_locked_nodes_are_never_evicted_and_lru_goes_first() -> None:
    t = RadixCache(page_size=1)
    a, _ = t.insert([1, 2], [10, 11])
    _b, _ = t.insert([5, 6], [50, 51])
    _c, _ = t.insert([7], [70])
    t.lock(a)
    t.match([5, 6])  # b becomes the most recently used leaf
    assert t.evict(1) == [70]  # c: least recently used unlocked leaf
    assert t.evict(5) == [50, 51]  # then b; a is locked
    assert t.match([1, 2]).pages == [10, 11]
    t.unlock(a)
    assert sorted(t.evict(5)) == [10, 11] and t.num_pages == 0


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=12))
def test_matches_what_was_inserted(seqs: list[list[int]]) -> None:
    """Every inserted sequence's full pages are found again, pages are never shared by
    two different prefixes, and eviction of everything returns exactly the owned pages."""
    t = RadixCache(page_size=2)
    next_page = 0
    owned: dict[tuple[int, ...], int] = {}  # page-aligned prefix -> page id
    for seq in seqs:
        n = len(seq) // 2
        pages = list(range(next_page, next_page + n))
        next_page += n
        _, dups = t.insert(seq, pages)
        for i in range(n):
            key = tuple(seq[: 2 * (i + 1)])
            if key in owned:
                assert pages[i] in dups
            else:
                owned[key] = pages[i]
    for seq in seqs:
        n = len(seq) // 2
        for m in range(n + 1):  # 9 never occurs: a match stops there, mid-edge or not
            assert t.match_len([*seq[: 2 * m], 9, 9]) == 2 * m
        assert t.match(seq).pages == [owned[tuple(seq[: 2 * (i + 1)])] for i in range(n)]
    assert t.num_pages == len(owned)
    assert sorted(t.evict(10_000)) == sorted(owned.values())

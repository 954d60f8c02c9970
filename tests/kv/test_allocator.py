"""``KVAllocator.grow``: the slots of new positions, a range per page rather than a value per
position, against the definition (position p lives at page_list[p // page_size] * page_size +
p % page_size), in pieces as chunked prefill and decode ask for them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aserve.kv.allocator import KVAllocator


@settings(max_examples=200, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 3, 4, 16]),
    pieces=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    taken=st.integers(0, 30),
)
def test_grow_gives_each_position_its_page_slot(page_size: int, pieces: list[int], taken: int) -> None:
    kv = KVAllocator(num_pages=600, page_size=page_size, num_rows=2, max_context=600)
    assert kv.pages.alloc(taken) is not None or taken == 0  # the pool's pages are not 0, 1, 2, ...
    page_list: list[int] = []
    length = 0
    for n in pieces:
        slots = kv.grow(page_list, length, length + n)
        assert slots is not None
        want = [page_list[p // page_size] * page_size + p % page_size for p in range(length, length + n)]
        assert slots == want
        assert len(page_list) == -(-(length + n) // page_size)  # exactly the pages these positions need
        length += n

"""KV bookkeeping on the host: request rows, paged token slots and the ledger (no tensors).

Ownership is plain host data; the device only ever sees slot numbers. Nothing here decides
*when* a resource may be freed: the scheduler frees at a safe point (after the last step that
read it has been committed), see ``docs/architecture.md``. The tensors these numbers index
live in :class:`aserve.kv.pool.KVPool`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain


@dataclass(frozen=True)
class LedgerView:
    total_pages: int
    free_pages: int
    used_pages: int
    page_size: int
    total_rows: int
    free_rows: int
    cached_pages: int = 0  # held by the prefix cache (counted in used_pages)

    @property
    def balanced(self) -> bool:
        return self.free_pages + self.used_pages == self.total_pages and self.cached_pages <= self.used_pages

    @property
    def in_use_pages(self) -> int:
        return self.used_pages - self.cached_pages

    @property
    def all_free(self) -> bool:
        """No request holds KV or a row: free + cached == total."""
        return self.free_pages + self.cached_pages == self.total_pages and self.free_rows == self.total_rows


class ReqRowPool:
    """Rows of the request-to-token table. A request keeps its row for its whole life.

    ``generation[row]`` counts reuses so asynchronous readers can detect ABA reuse.
    """

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        # Pop from the end: low rows are handed out first, which keeps traces readable.
        self._free = list(range(num_rows - 1, -1, -1))
        self._in_use: set[int] = set()
        self.generation = [0] * num_rows

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        if not self._free:
            return None
        row = self._free.pop()
        self._in_use.add(row)
        self.generation[row] += 1
        return row

    def free(self, row: int) -> None:
        assert row in self._in_use, f"double free of request row {row}"
        self._in_use.remove(row)
        self._free.append(row)


class PageAllocator:
    """Fixed-size pages of KV slots. Slot ``s`` lives in page ``s // page_size``."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        assert num_pages > 0 and page_size > 0, (num_pages, page_size)
        self.num_pages = num_pages
        self.page_size = page_size
        self._free = list(range(num_pages - 1, -1, -1))
        self._used = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self._used

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        self._used += n
        return pages

    def free(self, pages: list[int]) -> None:
        self._used -= len(pages)
        assert self._used >= 0, f"freed more pages than allocated ({self._used})"
        self._free.extend(pages)


class KVAllocator:
    """Everything a request holds in KV memory, as numbers: its row and its pages.

    Slots are computed on the host from each request's page list (slot ``s`` is position
    ``s % page_size`` of page ``s // page_size``)."""

    def __init__(self, num_pages: int, page_size: int, num_rows: int, max_context: int) -> None:
        self.page_size = page_size
        self.max_context = max_context
        self.rows = ReqRowPool(num_rows)
        self.pages = PageAllocator(num_pages, page_size)

    @property
    def total_tokens(self) -> int:
        return self.pages.num_pages * self.page_size

    @property
    def free_tokens(self) -> int:
        return self.pages.num_free * self.page_size

    def pages_needed(self, allocated_pages: int, new_len: int) -> int:
        return max(0, -(-new_len // self.page_size) - allocated_pages)

    def grow(self, page_list: list[int], old_len: int, new_len: int) -> list[int] | None:
        """Make positions ``[old_len, new_len)`` of a request addressable.

        Allocates pages into ``page_list`` as needed and returns the new slots, or None (and
        allocates nothing) when the pool is short.
        """
        assert new_len <= self.max_context, (new_len, self.max_context)
        need = self.pages_needed(len(page_list), new_len)
        if need:
            got = self.pages.alloc(need)
            if got is None:
                return None
            page_list.extend(got)
        if new_len <= old_len:
            return []
        # A range a page, chained in C (a prompt chunk is thousands of positions; its pages, a
        # few hundred): the first and last pages may be partial.
        ps = self.page_size
        first, last = old_len // ps, (new_len - 1) // ps
        starts = [p * ps for p in page_list[first : last + 1]]
        ends = [s + ps for s in starts]
        starts[0] += old_len - first * ps
        ends[-1] -= (last + 1) * ps - new_len
        return list(chain.from_iterable(map(range, starts, ends)))

    def ledger(self, cached_pages: int = 0) -> LedgerView:
        return LedgerView(
            cached_pages=cached_pages,
            total_pages=self.pages.num_pages,
            free_pages=self.pages.num_free,
            used_pages=self.pages.num_used,
            page_size=self.page_size,
            total_rows=self.rows.num_rows,
            free_rows=self.rows.num_free,
        )

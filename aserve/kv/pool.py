"""KV memory: request rows, paged token slots, the per-layer cache tensors, the ledger.

Ownership is plain host bookkeeping; the device only ever sees slot numbers. Nothing here
decides *when* a resource may be freed: the scheduler frees at a safe point (after the last
step that read it has been committed), see ``docs/architecture.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aserve.models.config import ModelConfig


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

    def can_alloc(self, n: int) -> bool:
        return n <= len(self._free)

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


class KVPool:
    """Everything a request holds in KV memory, in one place.

    Slots are computed on the host from each request's page list; the request-to-token
    table lives on the device only and is written inside each step (on the device's
    stream), so the host can plan step n+1 while step n still reads the table.
    """

    def __init__(
        self,
        config: ModelConfig,
        num_pages: int,
        page_size: int,
        num_rows: int,
        max_context: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.page_size = page_size
        self.max_context = max_context
        self.rows = ReqRowPool(num_rows)
        self.pages = PageAllocator(num_pages, page_size)
        num_slots = num_pages * page_size
        # One extra slot at the end: padded (unused) token positions may point there.
        self.kv_cache: list[tuple[torch.Tensor, torch.Tensor]] = [
            (
                torch.zeros(num_slots + 1, config.num_kv_heads, config.head_dim, dtype=dtype, device=device),
                torch.zeros(num_slots + 1, config.num_kv_heads, config.head_dim, dtype=dtype, device=device),
            )
            for _ in range(config.num_layers)
        ]
        # One spare row at the end that no request gets: padded decode-graph rows use it.
        self.table_device = torch.zeros(num_rows + 1, max_context, dtype=torch.int64, device=device)
        self.pad_row = num_rows
        self.pad_slot = num_slots

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
        ps = self.page_size
        return [page_list[pos // ps] * ps + pos % ps for pos in range(old_len, new_len)]

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

    def bytes_per_token(self) -> int:
        k, _ = self.kv_cache[0]
        return 2 * len(self.kv_cache) * k.shape[1] * k.shape[2] * k.element_size()


def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize

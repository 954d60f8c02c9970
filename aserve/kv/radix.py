"""A radix tree over token ids whose values are KV pages: the prefix cache.

Keys are page-aligned: every edge holds a whole number of pages (``page_size`` tokens per
page), so a cached prefix is always a run of complete pages and a matching request can
point its request-to-token row straight at them.

Ownership: pages in the tree belong to the tree. A request that matched a prefix *locks*
the deepest matched node (and so every node up to the root); locked nodes are never
evicted. Only unlocked leaves are evicted, least recently used first. The tree never
decides *when* something may be inserted or evicted; the scheduler does that at commit
points (see docs/architecture.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    key: tuple[int, ...]  # tokens on the edge into this node (a multiple of page_size)
    pages: list[int]  # one page per page_size tokens of ``key``
    parent: Node | None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)  # by first page's tokens
    lock_ref: int = 0
    last_access: int = 0


@dataclass(frozen=True)
class MatchResult:
    pages: list[int]  # cached pages covering the matched prefix, in order
    node: Node  # deepest matched node (lock it while the pages are in use)

    @property
    def num_pages(self) -> int:
        return len(self.pages)


class RadixCache:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.root = Node(key=(), pages=[], parent=None)
        self.root.lock_ref = 1  # never evicted
        self._clock = itertools.count(1)
        self.num_pages = 0  # pages owned by the tree
        self.num_evicted_pages = 0

    # Edges are compared a whole run of pages at a time (one tuple of the tokens against the
    # edge's key, in C), not page by page: a prompt chunk's commit publishes its whole prefix
    # again, and an 8192-token prefill step publishes 32 of them.

    def _page(self, tokens: Sequence[int], i: int) -> tuple[int, ...]:
        """Page ``i`` of ``tokens``: the key a node's children are kept under."""
        ps = self.page_size
        return tuple(tokens[i * ps : (i + 1) * ps])

    def _walk(self, tokens: Sequence[int]) -> tuple[list[tuple[Node, int]], int]:
        """The nodes along the longest cached page-aligned prefix of ``tokens``, each with the
        number of its pages that match (all but perhaps the last's), and the pages matched."""
        ps = self.page_size
        total = len(tokens) // ps
        node, i, path = self.root, 0, []
        while i < total:
            child = node.children.get(self._page(tokens, i))
            if child is None:
                break
            n = self._common_pages(child, tokens, i, total)
            path.append((child, n))
            i += n
            if n < len(child.pages):
                break
            node = child
        return path, i

    def _common_pages(self, child: Node, tokens: Sequence[int], start: int, total: int) -> int:
        """Pages of ``child``'s edge that ``tokens`` repeat from page ``start`` (at least one:
        the first page is the key ``child`` was found under)."""
        ps = self.page_size
        n = min(len(child.pages), total - start)
        if tuple(tokens[start * ps : (start + n) * ps]) == child.key[: n * ps]:
            return n
        k = 1
        while child.key[k * ps : (k + 1) * ps] == tuple(tokens[(start + k) * ps : (start + k + 1) * ps]):
            k += 1
        return k

    # -- lookup --------------------------------------------------------------

    def match(self, tokens: Sequence[int]) -> MatchResult:
        """The longest cached page-aligned prefix of ``tokens`` (splits an edge if needed)."""
        now = next(self._clock)
        node, pages = self.root, []
        path, _ = self._walk(tokens)
        for child, n in path:
            if n < len(child.pages):
                child = self._split(child, n)
            child.last_access = now
            pages.extend(child.pages)
            node = child
        return MatchResult(pages, node)

    def match_len(self, tokens: Sequence[int]) -> int:
        """Tokens of the longest cached page-aligned prefix; changes nothing (no split, no LRU)."""
        return self._walk(tokens)[1] * self.page_size

    def _split(self, child: Node, n: int) -> Node:
        """Cut ``child``'s edge after ``n`` pages; returns the new upper node."""
        ps = self.page_size
        assert child.parent is not None and 0 < n < len(child.pages)
        upper = Node(key=child.key[: n * ps], pages=child.pages[:n], parent=child.parent)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        child.parent.children[child.key[:ps]] = upper
        child.key, child.pages, child.parent = child.key[n * ps :], child.pages[n:], upper
        upper.children[child.key[:ps]] = child
        return upper

    # -- insertion -------------------------------------------------------------

    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> tuple[Node, list[int]]:
        """Publish ``pages`` as the KV of the page-aligned prefix of ``tokens``.

        Returns the deepest node of the prefix and the caller's pages that were *not*
        taken because the tree already holds that range (duplicates from concurrent
        identical prefixes): those remain the caller's to free.
        """
        ps = self.page_size
        total = len(tokens) // ps
        assert len(pages) >= total, (len(pages), total)
        match = self.match(tokens)
        matched = match.num_pages
        duplicates = [p for p, q in zip(pages[:matched], match.pages) if p != q]
        node = match.node
        if matched < total:
            new = Node(
                key=tuple(tokens[matched * ps : total * ps]),
                pages=list(pages[matched:total]),
                parent=node,
                last_access=next(self._clock),
            )
            node.children[new.key[:ps]] = new
            self.num_pages += len(new.pages)
            node = new
        return node, duplicates

    # -- locking and eviction --------------------------------------------------------

    def lock(self, node: Node) -> None:
        n: Node | None = node
        while n is not None:
            n.lock_ref += 1
            n = n.parent

    def unlock(self, node: Node) -> None:
        n: Node | None = node
        while n is not None:
            n.lock_ref -= 1
            assert n.lock_ref >= 0, "radix node unlocked more often than locked"
            n = n.parent

    def evictable_pages(self) -> int:
        return sum(len(n.pages) for n in self._nodes() if n.lock_ref == 0)

    def evict(self, num_pages: int) -> list[int]:
        """Remove unlocked leaves, least recently used first, until ``num_pages`` are freed."""
        freed: list[int] = []
        while len(freed) < num_pages:
            leaves = [n for n in self._nodes() if not n.children and n.lock_ref == 0 and n is not self.root]
            if not leaves:
                break
            victim = min(leaves, key=lambda n: n.last_access)
            assert victim.parent is not None
            del victim.parent.children[victim.key[: self.page_size]]
            freed.extend(victim.pages)
            self.num_pages -= len(victim.pages)
        self.num_evicted_pages += len(freed)
        return freed

    def flush(self) -> list[int]:
        """Drop every unlocked node (all of them when nothing runs); returns their pages."""
        return self.evict(self.num_pages)

    def _nodes(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

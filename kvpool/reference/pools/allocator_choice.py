"""``allocator_for``: the token-slot allocator a page size calls for (the reference twin).

The one place that picks between :class:`~kvpool.reference.pools.token_allocator.
TokenToKVPoolAllocator` (page size 1) and :class:`~kvpool.reference.pools.paged_allocator.
PagedTokenToKVPoolAllocator` (any other page size), so that every component that builds its own
allocator (the lifecycle, the SWA allocator's two pools, the harness) builds the same one.
"""

from __future__ import annotations

from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator
from kvpool.rules import Rules


def allocator_for(
    size: int, page_size: int, need_sort: bool = False, *, rules: Rules | None = None
) -> BaseTokenToKVPoolAllocator:
    """An allocator of ``size`` tokens in pages of ``page_size`` tokens:
    ``TokenToKVPoolAllocator(size, need_sort, rules=rules)`` when ``page_size == 1``, else
    ``PagedTokenToKVPoolAllocator(size, page_size, need_sort, rules=rules)``. Raises what the
    chosen constructor raises (PageSizeError, ConfigError)."""
    if page_size == 1:
        return TokenToKVPoolAllocator(size, need_sort, rules=rules)
    return PagedTokenToKVPoolAllocator(size, page_size, need_sort, rules=rules)


__all__ = ["allocator_for"]

"""``allocator_for`` (optimized twin): the token-slot allocator a page size calls for.

The one place that picks between :class:`~kvpool.optimized.pools.token_allocator.
TokenToKVPoolAllocator` (page size 1) and :class:`~kvpool.optimized.pools.paged_allocator.
PagedTokenToKVPoolAllocator` (any other page size), as
:mod:`kvpool.reference.pools.allocator_choice` does for the reference.
"""

from __future__ import annotations

from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.optimized.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.optimized.pools.token_allocator import TokenToKVPoolAllocator
from kvpool.rules import Rules


def allocator_for(
    size: int,
    page_size: int,
    need_sort: bool = False,
    *,
    rules: Rules | None = None,
    options: TwinOptions | None = None,
) -> BaseTokenToKVPoolAllocator:
    """An allocator of ``size`` tokens in pages of ``page_size`` tokens:
    ``TokenToKVPoolAllocator`` when ``page_size == 1``, else ``PagedTokenToKVPoolAllocator``,
    built with ``need_sort``, ``rules`` and ``options`` (:class:`~kvpool.optimized.options.
    TwinOptions`; None: the defaults).
    Raises what the chosen constructor raises (PageSizeError, ConfigError)."""
    # The options go through as given: each constructor checks the sizes before the options.
    if page_size == 1:
        return TokenToKVPoolAllocator(
            size,
            need_sort,
            rules=rules,
            options=options,
        )
    return PagedTokenToKVPoolAllocator(
        size,
        page_size,
        need_sort,
        rules=rules,
        options=options,
    )


__all__ = ["allocator_for"]

"""``TokenToKVPoolAllocator``: the slot allocator for page size 1 (the reference twin).

Units: ``size`` tokens, each its own page: slot ids and page ids coincide (``1..size``; slot 0 is
reserved). ``alloc`` takes slots from the head of ``free_pages``; ``free`` appends them to its
tail (FIFO reuse), or to the tail of ``release_pages`` under ``need_sort``. Everything else
(validation, free groups, ``alloc_extend`` / ``alloc_decode``, segment frees) comes from
:class:`~kvpool.reference.pools.allocator.BaseTokenToKVPoolAllocator`.
"""

from __future__ import annotations

from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.rules import Rules


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Page size 1: every slot is a page. ``alloc`` takes from the head of ``free_pages`` and
    ``free`` appends (FIFO reuse), or appends to ``release_pages`` under ``need_sort``. Naming a
    slot twice in one call or one free group is a double free."""

    _dedup_pages = False

    def __init__(self, size: int, need_sort: bool = False, *, rules: Rules | None = None) -> None:
        super().__init__(size, 1, need_sort, rules=rules)

    def _extend_merge_bound(self, extend_num_tokens: int, batch_size: int) -> int:
        """Page size 1: SGLang allocates an extend with ``alloc(extend_num_tokens)``, so the
        pre-test is ``alloc``'s."""
        return extend_num_tokens

    def _return_pages(self, pages: list[int]) -> None:
        if self.need_sort:
            self._set_free_lists(self.free_pages, self.release_pages + pages)
        else:
            self._set_free_lists(self.free_pages + pages, self.release_pages)


__all__ = ["TokenToKVPoolAllocator"]

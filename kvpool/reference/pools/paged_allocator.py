"""``PagedTokenToKVPoolAllocator``: the slot allocator for page sizes > 1 (any power of two).

Units: ``size`` tokens in ``num_pages = size // page_size`` pages with ids ``1..num_pages``;
page ``p`` owns slots ``[p * page_size, (p + 1) * page_size)``. Allocation takes whole pages from
the head of ``free_pages``; ``free`` returns whole pages to the HEAD (LIFO by page), so the page
freed last is reused first (under ``need_sort`` to the head of ``release_pages``, or to its tail
when ``rules.release_order`` is ``"append"``).
``alloc_extend`` / ``alloc_decode`` come from the shared base.
"""

from __future__ import annotations

from kvpool.errors import AlignmentError
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.rules import Rules


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Paged allocator. Freeing any slot of a page frees the whole page; slots of one page named
    several times in one call (or one free group) free it once. Raises PageSizeError for a page
    size that is not a power of two and ConfigError for a size that is not a positive multiple.
    """

    _dedup_pages = True

    def __init__(
        self, size: int, page_size: int, need_sort: bool = False, *, rules: Rules | None = None
    ) -> None:
        super().__init__(size, page_size, need_sort, rules=rules)

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size // page_size`` whole pages as slots, or ``None`` (no change). Raises
        AlignmentError when ``need_size`` is not a multiple of ``page_size`` (stricter than
        SGLang, which silently under-allocates), unless ``rules.unaligned_paged_alloc`` is
        ``"floor"``: then the ``need_size // page_size`` pages are handed out, as in SGLang."""
        self._check_need_size(need_size)
        if need_size % self.page_size and self.rules.unaligned_paged_alloc == "error":
            raise AlignmentError(
                f"paged alloc needs a multiple of page_size={self.page_size} tokens, "
                f"got {need_size}"
            )
        return super().alloc(need_size)

    def _return_pages_in_order(self, pages: list[int]) -> None:
        # SGLang 0.5.23's free_page_ids: the pages as given, no sort.
        if self.need_sort and self.rules.release_order == "append":
            self._set_free_lists(self.free_pages, self.release_pages + pages)
        elif self.need_sort:
            self._set_free_lists(self.free_pages, pages + self.release_pages)
        else:
            self._set_free_lists(pages + self.free_pages, self.release_pages)

    def _return_pages(self, pages: list[int]) -> None:
        # The freed pages, sorted and unique, go in front of free_pages (or, under need_sort, in
        # front of release_pages as SGLang 0.5.16 does, behind them as 0.5.23's staged pages;
        # a merge sorts them anyway).
        self._return_pages_in_order(sorted(pages))


__all__ = ["PagedTokenToKVPoolAllocator"]

"""SGLang 0.5.23's segment frees: ``free_page_ids`` and ``free_segment`` (both allocators).

Pages freed this way keep the order they are given (no sort, no de-duplication); the radix
cache frees through them under ``Rules.tree_free == "segment"``. A mixin of
:class:`~kvpool.reference.pools.allocator.BaseTokenToKVPoolAllocator`, which provides the free
lists, the validation and ``_return_pages_in_order`` (one place per order rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvpool.errors import AlignmentError, DoubleFreeError


class SegmentFrees:
    """``free_page_ids`` / ``free_segment`` over the host allocator's state."""

    page_size: int
    _in_free_group: bool
    _pending_pages: list[int]
    # provided by the allocator (annotations only, so that the allocator's methods are used)
    free: Callable[[Sequence[int]], None]
    _slots_of: Callable[[Sequence[int]], list[int]]
    _validate_free: Callable[[Sequence[int], Sequence[int]], list[int]]
    _return_pages_in_order: Callable[[list[int]], None]

    def free_page_ids(self, page_ids: Sequence[int]) -> None:
        """Free exactly these pages, in the given order (SGLang 0.5.23): no sort and no
        de-duplication (a page named twice is a double free). Paged: they go in front of
        ``free_pages`` as given. Inside a free group a paged allocator buffers them apart and
        returns them, in order, after the group's slot frees (as 0.5.23); page size 1 buffers
        them with the slot frees (0.5.23's token allocator frees segments with ``free``)."""
        pages = [int(p) for p in page_ids]
        if not pages:
            return
        if self._in_free_group and self.page_size == 1:
            self.free(self._slots_of(pages))
            return
        self._validate_free([p * self.page_size for p in pages], [])
        named = pages + self._pending_pages if self._in_free_group else pages
        twice = sorted({p for p in named if named.count(p) > 1})
        if twice:
            raise DoubleFreeError("pages named twice in one free_page_ids or free group", twice)
        if self._in_free_group:
            self._pending_pages.extend(pages)
            return
        self._return_pages_in_order(pages)

    def free_segment(self, free_index: Sequence[int], start_pos: int = 0) -> None:
        """Free the pages of a segment of a sequence that starts at column ``start_pos`` (a
        multiple of ``page_size``, else AlignmentError): one page per ``page_size`` slots, in
        order, through :meth:`free_page_ids` (SGLang 0.5.23's tree frees)."""
        slots = list(free_index)
        if not slots:
            return
        if start_pos % self.page_size:
            raise AlignmentError(f"segment start {start_pos} is not page-aligned")
        self._validate_free(slots, [])
        self.free_page_ids([s // self.page_size for s in slots[:: self.page_size]])


__all__ = ["SegmentFrees"]

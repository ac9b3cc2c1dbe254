"""SGLang 0.5.23's segment frees: ``free_page_ids`` and ``free_segment`` (both allocators).

Pages freed this way keep the order they are given (no sort, no de-duplication); the radix
cache frees through them under ``Rules.tree_free == "segment"``. A mixin of
:class:`~kvpool.optimized.pools.allocator.BaseTokenToKVPoolAllocator`, which provides the free
lists, the validation and ``_return_pages_in_order`` (one place per order rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvpool.errors import AlignmentError
from kvpool.optimized.pools.paged_ops import check_free_slots

IndexLike = torch.Tensor | Sequence[int]
"""Slots or page ids: a tensor (any device) or a sequence of ints."""


class SegmentFrees:
    """``free_page_ids`` / ``free_segment`` over the host allocator's state."""

    page_size: int
    _in_free_group: bool
    _pending_pages: list[torch.Tensor]
    _free_mask: torch.Tensor | None
    # provided by the allocator (annotations only, so that the allocator's methods are used)
    free: Callable[[IndexLike], None]
    _as_index: Callable[[IndexLike], torch.Tensor]
    _return_pages_in_order: Callable[[torch.Tensor], None]

    def free_page_ids(self, page_ids: IndexLike) -> None:
        """Free exactly these pages, in the given order (see the reference); inside a free
        group a paged allocator buffers them apart (returned after the group's slot frees),
        page size 1 with the slot frees."""
        pages = self._as_index(page_ids)
        if pages.numel() == 0:
            return
        if pages.dtype is not torch.int64:
            pages = pages.to(torch.int64)
        if self.page_size == 1:  # page ids are slot ids
            if self._in_free_group:
                self.free(pages)
                return
        elif self._in_free_group and self._free_mask is None:
            self._pending_pages.append(pages)  # unchecked: buffered as given, like free's
            return
        if self._free_mask is not None:  # a page named twice is a double free
            named = torch.cat((pages, *self._pending_pages)) if self._in_free_group else pages
            check_free_slots(named * self.page_size, self._free_mask, self.page_size, True, None)
        if self._in_free_group:
            self._pending_pages.append(pages)
            return
        self._return_pages_in_order(pages)

    def free_segment(self, free_index: IndexLike, start_pos: int = 0) -> None:
        """Free the pages of a segment starting at column ``start_pos`` (page-aligned, else
        AlignmentError): one page per ``page_size`` slots, in order (see the reference)."""
        slots = self._as_index(free_index)
        if slots.numel() == 0:
            return
        if slots.dtype is not torch.int64:
            slots = slots.to(torch.int64)
        ps = self.page_size
        if start_pos % ps:
            raise AlignmentError(f"segment start {start_pos} is not page-aligned")
        if self._free_mask is not None:
            check_free_slots(slots, self._free_mask, ps, False, None)
        if ps == 1:  # every slot is its own page
            self.free_page_ids(slots)
            return
        # ps is a power of two: a shift is the floor division, one tensor operation cheaper
        self.free_page_ids(slots[::ps] >> (ps.bit_length() - 1))


__all__ = ["SegmentFrees"]

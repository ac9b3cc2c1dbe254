"""``PagedTokenToKVPoolAllocator`` (optimized twin): the slot allocator for page sizes > 1.

Units: ``size`` tokens in ``num_pages = size // page_size`` pages with ids ``1..num_pages``;
page ``p`` owns slots ``[p * page_size, (p + 1) * page_size)``. Allocation takes whole pages from
the head of ``free_pages``; ``free`` puts the sorted unique pages of the freed slots at the HEAD
(LIFO by page), under ``need_sort`` at the head of ``release_pages`` (its tail when
``rules.release_order`` is ``"append"``). ``alloc_extend`` /
``alloc_decode`` come from the shared base.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from kvpool.errors import AlignmentError, IndexOutOfRangeError
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.rules import Rules


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Paged allocator (twin of :class:`kvpool.reference.pools.paged_allocator.
    PagedTokenToKVPoolAllocator`). Freeing any slot of a page frees the whole page; slots of one
    page named several times in one call (or one free group) free it once."""

    _dedup_pages = True

    def __init__(
        self,
        size: int,
        page_size: int,
        need_sort: bool = False,
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
    ) -> None:
        super().__init__(
            size,
            page_size,
            need_sort,
            rules=rules,
            options=options,
        )
        self._page_shift = page_size.bit_length() - 1  # page_size is a power of two

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size // page_size`` whole pages as int64 slots, or ``None`` (no change).
        AlignmentError when ``need_size`` is not a multiple of ``page_size``, unless
        ``rules.unaligned_paged_alloc`` is ``"floor"`` (then ``need_size // page_size`` pages)."""
        self._check_need_size(need_size)
        if need_size % self.page_size and self.rules.unaligned_paged_alloc == "error":
            raise AlignmentError(
                f"paged alloc needs a multiple of page_size={self.page_size} tokens, "
                f"got {need_size}"
            )
        return super().alloc(need_size)

    def _return_pages_in_order(
        self,
        pages: torch.Tensor,
        owned: bool = False,
        host: npt.NDArray[np.int64] | None = None,
    ) -> None:
        # SGLang 0.5.23's free_page_ids: the pages as given, no sort. ``owned``: ``pages`` is a
        # fresh tensor (else staging copies it: it may be the caller's); ``host``: a fresh
        # numpy array ``pages`` was made from (the CPU de-duplication's).
        if self._free_mask is not None:
            self._set_free(pages, True)
        if not self.need_sort:
            self._free_list.prepend(pages, host)  # no copy of the list (SGLang: one per free)
        else:
            self._free_list.stage(
                pages if owned else pages.clone(), self.rules.release_order == "append"
            )

    def _return_pages(self, slots: torch.Tensor) -> None:
        host = self._sorted_unique_host_pages(slots)
        if host is None:
            self._return_pages_in_order(self._sorted_unique_pages(slots), owned=True)
        else:
            self._return_pages_in_order(torch.from_numpy(host), owned=True, host=host)

    def _sorted_unique_pages(self, slots: torch.Tensor) -> torch.Tensor:
        """The sorted unique pages of ``slots`` (valid slots, so >= 0: a shift divides), as a
        fresh tensor."""
        host = self._sorted_unique_host_pages(slots)
        if host is not None:
            return torch.from_numpy(host)
        pages = slots >> self._page_shift
        # Not on the CPU: sort + unique_consecutive (torch.unique's result, ~3x faster).
        unique: torch.Tensor = torch.unique_consecutive(torch.sort(pages).values)
        return unique

    def _sorted_unique_host_pages(self, slots: torch.Tensor) -> npt.NDArray[np.int64] | None:
        """CPU int64 ``slots``: their sorted unique pages as a fresh numpy array (one read of
        a numpy view of the slots); None for any other (see :meth:`_sorted_unique_pages`)."""
        if slots.is_cpu and slots.dtype is torch.int64:
            host = slots.numpy() >> self._page_shift
            if host.size * _BITMAP_SLOTS_PER_PAGE < self.num_pages:
                return _sorted_unique_host(host)
            # Many slots for the pool: mark a per-page bitmap and read it back in page order,
            # linear in slots + pages instead of a sort (about 7x faster for a 40k-slot batch);
            # numpy's three steps cost about half of torch's (zeros, index_fill_,
            # masked_select) at a few thousand pages. CPU only: elsewhere both forms wait for
            # the device to size their result, and a GPU sort is cheap.
            marked = np.zeros(self.num_pages + 1, dtype=np.bool_)
            try:
                marked[host] = True
            except IndexError:  # unchecked mode: a slot past the pool
                raise IndexOutOfRangeError(
                    f"free_index: pages outside 0..{self.num_pages}: {host.tolist()[:8]}"
                ) from None
            return np.flatnonzero(marked).astype(np.int64, copy=False)
        return None


def _sorted_unique_host(pages: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``torch.unique(pages)`` (sorted) on the host, for a few slots' pages: first one page per
    run of equal pages (a request's slots come page by page: up to ``page_size`` times fewer to
    sort), then a sort and the same run filter. numpy's sort and masks cost a fraction of torch's
    per-operation overhead on arrays of this size. ``pages`` is a fresh array (changed here)."""
    if pages.size > _PRESORT_RUNS_ABOVE:
        pages = pages[_run_starts(pages)]
    if pages.size > 1:
        pages.sort()
        pages = pages[_run_starts(pages)]
    return pages


def _run_starts(a: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """True where ``a`` starts a run of equal values."""
    starts = np.empty(a.size, dtype=np.bool_)
    starts[0] = True
    np.not_equal(a[1:], a[:-1], out=starts[1:])
    return starts


_PRESORT_RUNS_ABOVE = 64
"""Slots above which :func:`_sorted_unique_host` keeps one page per run before sorting (fewer
are sorted as they are: the filter's few numpy calls cost more than sorting them)."""

_BITMAP_SLOTS_PER_PAGE = 8
"""Use the bitmap when ``slots * this >= num_pages``: on a CPU a page of the bitmap costs about
as much as a few slots of the sort."""

__all__ = ["PagedTokenToKVPoolAllocator"]

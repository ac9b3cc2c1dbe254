"""SGLang's batch allocations, ``alloc_extend`` and ``alloc_decode`` (reference twin).

A mixin of :class:`~kvpool.reference.pools.allocator.BaseTokenToKVPoolAllocator`, which provides the
free lists, the ``need_sort`` merge and the page taking. Units: lengths are tokens, results are
lists of slot ids; ``last_loc`` is the slot of token ``P_i - 1`` (-1 when ``P_i == 0``). Every
misuse raises before any change; an allocation that does not fit returns ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import IndexOutOfRangeError, InvalidArgumentError, ReservedIndexError
from kvpool.host_checks import int_list
from kvpool.reference.pools.paged_ops import (
    alloc_decode_slots,
    alloc_extend_slots,
    decode_new_pages,
    extend_new_pages,
    validate_extend_args,
)


class BatchAllocs:
    """``alloc_extend`` / ``alloc_decode`` over the host allocator's state."""

    page_size: int
    num_pages: int
    free_pages: list[int]
    _free_set: set[int]
    # provided by the allocator (annotations only, so that the allocator's methods are used)
    _merge_before_take: Callable[[bool, int], None]
    _take_pages: Callable[[int], list[int] | None]
    _extend_merge_bound: Callable[[int, int], int]

    def _check_batch(
        self, name: str, device: Sequence[int], host: Sequence[int]
    ) -> tuple[list[int], list[int]]:
        dev, cpu = int_list(name, device), int_list(f"{name}_cpu", host)
        if dev != cpu:
            raise InvalidArgumentError(f"{name} and {name}_cpu differ: {dev} vs {cpu}")
        return dev, cpu

    def _check_prefix_pages_held(self, prefix_lens: Sequence[int], last_loc: Sequence[int]) -> None:
        """A prefix that ends mid-page gets its next slots from ``last_loc``'s page, so that page
        must exist and be allocated (not free)."""
        for i, (p, loc) in enumerate(zip(prefix_lens, last_loc, strict=True)):
            if p % self.page_size == 0:
                continue
            page = loc // self.page_size
            if page > self.num_pages:
                raise IndexOutOfRangeError(f"request {i}: last_loc {loc} is past the pool")
            if page == RESERVED_INDEX:
                raise ReservedIndexError(f"request {i}: last_loc {loc} is in the reserved page")
            if page in self._free_set:
                raise InvalidArgumentError(f"request {i}: last_loc {loc} is in free page {page}")

    def alloc_extend(
        self,
        prefix_lens: Sequence[int],
        prefix_lens_cpu: Sequence[int],
        seq_lens: Sequence[int],
        seq_lens_cpu: Sequence[int],
        last_loc: Sequence[int],
        extend_num_tokens: int,
    ) -> list[int] | None:
        """Slots for tokens ``[P_i, S_i)`` of every request, in batch order (see
        :func:`~kvpool.reference.pools.paged_ops.alloc_extend_slots`), or ``None`` (no change) when
        the ``sum(ceil(S/ps) - ceil(P/ps))`` new pages do not fit. Raises InvalidArgumentError /
        AlignmentError / IndexOutOfRangeError / ReservedIndexError for a bad batch (see
        :func:`~kvpool.reference.pools.paged_ops.validate_extend_args`; also ``*_cpu`` must equal
        the device lists and a prefix ending mid-page must end in an allocated page)."""
        prefix, _ = self._check_batch("prefix_lens", prefix_lens, prefix_lens_cpu)
        seq, _ = self._check_batch("seq_lens", seq_lens, seq_lens_cpu)
        locs = int_list("last_loc", last_loc)
        validate_extend_args(prefix, seq, locs, extend_num_tokens, self.page_size)
        self._check_prefix_pages_held(prefix, locs)
        num_new = sum(
            extend_new_pages(p, s, self.page_size) for p, s in zip(prefix, seq, strict=True)
        )
        merge_test = self._extend_merge_bound(extend_num_tokens, len(seq)) > len(self.free_pages)
        self._merge_before_take(merge_test, num_new)
        pages = self._take_pages(num_new)
        if pages is None:
            return None
        return alloc_extend_slots(prefix, seq, locs, pages, self.page_size)

    def alloc_decode(
        self, seq_lens: Sequence[int], seq_lens_cpu: Sequence[int], last_loc: Sequence[int]
    ) -> list[int] | None:
        """One slot per request for token ``S_i - 1`` (``S_i >= 1`` counts the new token): the
        first slot of the next free page when ``(S_i - 1) % page_size == 0``, else
        ``last_loc_i + 1``. ``None`` (no change) if the new pages do not fit. Same checks as
        :meth:`alloc_extend` with ``P_i = S_i - 1``: ``last_loc_i == -1`` exactly when
        ``S_i == 1``, and mid-page ``last_loc_i`` sits at offset ``(S_i - 2) % ps`` of an
        allocated page."""
        seq, _ = self._check_batch("seq_lens", seq_lens, seq_lens_cpu)
        locs = int_list("last_loc", last_loc)
        if any(s < 1 for s in seq):
            raise InvalidArgumentError(f"alloc_decode needs every seq_len >= 1, got {seq}")
        prefix = [s - 1 for s in seq]
        validate_extend_args(prefix, seq, locs, len(seq), self.page_size)
        self._check_prefix_pages_held(prefix, locs)
        num_new = decode_new_pages(seq, self.page_size)
        self._merge_before_take(len(seq) > len(self.free_pages), num_new)
        pages = self._take_pages(num_new)
        if pages is None:
            return None
        return alloc_decode_slots(seq, locs, pages, self.page_size)


__all__ = ["BatchAllocs"]

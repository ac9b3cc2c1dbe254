"""The request table and the token-slot allocators: ``ReqToTokenPoolProtocol``,
``TokenAllocatorProtocol``, ``PagedAllocatorProtocol`` and 0.5.23's ``SegmentAllocatorProtocol``.
Units: rows of the table; slots (tokens) and pages of the allocators.

The rules every method shares: :mod:`kvpool.protocols`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvpool.protocols.index import IdxT
from kvpool.protocols.requests import ReqLike
from kvpool.snapshot import (
    AllocatorSnapshot,
    ReqToTokenSnapshot,
)


class ReqToTokenPoolProtocol(Protocol[IdxT]):
    """Request-to-token table: ``req_to_token[row, col]`` is the slot of token ``col`` of the
    request in ``row``. Rows ``1..size`` are allocatable; row 0 is reserved.

    Free rows form a stack: ``alloc`` pops from the tail, ``free`` pushes on the tail (LIFO: a freed
    row is reused first). A fresh pool's stack is ``[size, ..., 2, 1]``, so rows come out 1, 2, 3...
    ``req_generation[row]`` is bumped each time the row is handed out and never goes backwards."""

    size: int
    max_context_len: int

    def alloc(self, reqs: Sequence[ReqLike]) -> list[int] | None:
        """Give every request without a row a fresh row, in batch order; keep the rows of the
        (legally) reusing ones. Sets ``req.req_pool_idx``. Returns every request's row in batch
        order, or ``None`` (nothing changed) when fewer rows are free than needed.
        Raises :class:`~kvpool.errors.RowReuseError` for an illegal reuse."""
        ...

    def check_alloc(self, reqs: Sequence[ReqLike]) -> int:
        """Validate a batch for :meth:`alloc` without changing anything (the reuse rule
        above); returns the number of fresh rows it needs. The manager calls it before its
        first change."""
        ...

    def free(self, req: ReqLike) -> None:
        """Return the request's row and clear ``req.req_pool_idx``; table contents untouched.
        Raises :class:`~kvpool.errors.DoubleFreeError` if the row is already free."""
        ...

    def write(self, index: tuple[int, slice], values: IdxT) -> None:
        """``req_to_token[row, start:stop] = values``. ``index`` is ``(row, slice(start, stop))``
        with explicit bounds; ``stop <= max_context_len`` else
        :class:`~kvpool.errors.ContextOverflowError`; row 0 or a row out of range is refused."""
        ...

    def read(self, row: int, start: int, stop: int) -> IdxT:
        """``req_to_token[row, start:stop]`` (a copy)."""
        ...

    def available_size(self) -> int:
        """Number of free rows."""
        ...

    def clear(self) -> None:
        """Free every row. Generations are kept (they never go backwards)."""
        ...

    def snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> ReqToTokenSnapshot:
        """Plain snapshot; ``rows`` lists ``(row, length)`` pairs whose contents to include."""
        ...


class TokenAllocatorProtocol(Protocol[IdxT]):
    """Slot allocator. ``size`` tokens in ``size // page_size`` pages with ids ``1..num_pages``.

    Page size 1 (``TokenToKVPoolAllocator``): ``alloc`` takes from the head of ``free_pages`` and
    ``free`` appends (FIFO). Page size > 1 (``PagedTokenToKVPoolAllocator``): ``free`` prepends the
    sorted unique pages of the freed slots (LIFO by page). With ``need_sort`` frees go to
    ``release_pages`` and are merged (sorted) into ``free_pages`` when an allocation finds it short.
    """

    size: int
    page_size: int
    need_sort: bool

    def available_size(self) -> int:
        """Free tokens: ``(len(free_pages) + len(release_pages)) * page_size``."""
        ...

    def alloc(self, need_size: int) -> IdxT | None:
        """``need_size`` slots (whole pages when paged: ``need_size % page_size == 0`` else
        :class:`~kvpool.errors.AlignmentError`), or ``None`` if they do not fit."""
        ...

    def free(self, free_index: IdxT) -> None:
        """Return slots. Paged: freeing any slot of a page frees the whole page; duplicates within
        one call (or one free group) name the same page once. Page size 1: duplicates are a double
        free. Freeing slot/page 0, an out-of-range slot or one not allocated raises before any
        change. Inside a free group the slots are buffered until :meth:`free_group_end`."""
        ...

    def free_group_begin(self) -> None:
        """Start buffering frees (not nestable)."""
        ...

    def free_group_end(self) -> None:
        """Perform the buffered frees as ONE :meth:`free` of their concatenation."""
        ...

    def backup_state(self) -> Any:
        """Opaque copy of the free lists (EAGLE v1 borrows draft slots with it)."""
        ...

    def restore_state(self, state: Any) -> None:
        """Put back free lists taken by :meth:`backup_state`."""
        ...

    def merge_and_sort_free(self) -> None:
        """``free_pages = sorted(free_pages + release_pages)``; ``release_pages = []``."""
        ...

    def clear(self) -> None:
        """Every page free again (ids ascending), no release pages, no open group."""
        ...

    def snapshot(self) -> AllocatorSnapshot:
        """Plain snapshot of the free lists and group state."""
        ...


class PagedAllocatorProtocol(TokenAllocatorProtocol[IdxT], Protocol[IdxT]):
    """Paged allocator batch operations (SGLang's call shapes; ``*_cpu`` are host copies of the
    lengths, so that the twin never needs a device-to-host sync; the reference takes lists)."""

    def alloc_extend(
        self,
        prefix_lens: IdxT,
        prefix_lens_cpu: Sequence[int],
        seq_lens: IdxT,
        seq_lens_cpu: Sequence[int],
        last_loc: IdxT,
        extend_num_tokens: int,
    ) -> IdxT | None:
        """Slots for tokens ``[P_i, S_i)`` of each request, in batch order (three parts: finish
        the prefix's partial page, whole new pages, the tail on the last new page). ``last_loc`` is
        the slot of token ``P_i - 1`` or -1 when ``P_i == 0``. ``None`` if the new pages do not fit.
        """
        ...

    def alloc_decode(
        self, seq_lens: IdxT, seq_lens_cpu: Sequence[int], last_loc: IdxT
    ) -> IdxT | None:
        """One slot per request for token ``S_i - 1`` (``seq_lens`` counts it): ``last_loc + 1``,
        or the first slot of the next free page when ``(S_i - 1) % page_size == 0``."""
        ...


class SegmentAllocatorProtocol(TokenAllocatorProtocol[IdxT], Protocol[IdxT]):
    """A token allocator that also frees SGLang 0.5.23's way (``Rules.tree_free == "segment"``,
    :class:`kvpool.reference.pools.allocator.BaseTokenToKVPoolAllocator`): what the radix cache
    and the sessions hand slots to."""

    def free_page_ids(self, page_ids: IdxT) -> None:
        """Free exactly these pages (page ids, not slots), in the given order."""
        ...

    def free_segment(self, free_index: IdxT, start_pos: int = 0) -> None:
        """Free the pages of a row segment starting at column ``start_pos`` (a multiple of
        ``page_size`` tokens): one page per ``page_size`` slots, in order."""
        ...


__all__ = [
    "PagedAllocatorProtocol",
    "ReqToTokenPoolProtocol",
    "SegmentAllocatorProtocol",
    "TokenAllocatorProtocol",
]

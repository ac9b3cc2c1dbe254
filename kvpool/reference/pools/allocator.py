"""``BaseTokenToKVPoolAllocator``: what the token-slot allocators share (the reference twin).

The page-size-1 ``TokenToKVPoolAllocator`` (:mod:`kvpool.reference.pools.token_allocator`) and
the ``PagedTokenToKVPoolAllocator`` (:mod:`kvpool.reference.pools.paged_allocator`) derive from it
and fix only the order freed pages re-enter the free lists; everything else lives here: the free
lists and ``need_sort`` merges, ``alloc`` / ``free`` and free groups, SGLang's batch
``alloc_extend`` / ``alloc_decode``, and SGLang 0.5.23's segment frees (``free_page_ids`` /
``free_segment``: pages in the order given, no sort, no de-duplication; the radix cache frees
through them under ``Rules.tree_free == "segment"``).

Units: ``size`` and lengths are tokens; ``free_pages`` / ``release_pages`` hold page ids
``1..num_pages`` (page ``p`` owns slots ``[p * page_size, (p + 1) * page_size)``); every result
is a list of slot ids. With ``page_size == 1`` page ids and slot ids coincide.

Checked always (the reference has no unchecked mode): every misuse raises a typed
:class:`~kvpool.errors.KVPoolError` before any change, and an allocation that does not fit
returns ``None`` and changes nothing (not even a ``need_sort`` merge), unless
``rules.refused_alloc_unchanged`` is False (:class:`~kvpool.rules.Rules`).

``need_sort`` merges follow SGLang's pre-tests, made on the lengths before anything is taken
(specs/fidelity.md): ``alloc(n)`` merges when ``n // page_size > len(free_pages)``;
``alloc_extend`` when ``extend_num_tokens // page_size + batch_size + 1 > len(free_pages)``
(page size 1: ``extend_num_tokens > len(free_pages)``, as SGLang's ``alloc``); ``alloc_decode``
when ``batch_size > len(free_pages)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.constants import RESERVED_INDEX, is_power_of_two
from kvpool.errors import (
    AlignmentError,
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    PageSizeError,
    ReservedIndexError,
)
from kvpool.host_checks import as_count, int_list
from kvpool.records import fast_record
from kvpool.reference.pools.paged_ops import (
    alloc_decode_slots,
    alloc_extend_slots,
    decode_new_pages,
    extend_new_pages,
    validate_extend_args,
)
from kvpool.rules import Rules
from kvpool.snapshot import AllocatorSnapshot

_SNAPSHOT = fast_record(AllocatorSnapshot)
"""Builds an :class:`AllocatorSnapshot` (every field by keyword: :func:`fast_record`)."""

FreeListState = tuple[tuple[int, ...], tuple[int, ...]]
"""What :meth:`BaseTokenToKVPoolAllocator.backup_state` returns: ``(free_pages, release_pages)``."""


class BaseTokenToKVPoolAllocator:
    """Page allocator over ``size // page_size`` pages with ids ``1..num_pages``.

    Subclasses choose how freed pages re-enter the free list (:meth:`_return_pages`) and whether a
    slot may be named twice in one free (:attr:`_dedup_pages`). Everything else, including the
    batch operations ``alloc_extend`` / ``alloc_decode``, is shared.
    """

    _dedup_pages: bool = True
    """True: freeing two slots of one page (in a call or a group) frees the page once."""

    def __init__(
        self, size: int, page_size: int, need_sort: bool = False, *, rules: Rules | None = None
    ) -> None:
        if not isinstance(page_size, int) or not is_power_of_two(page_size):
            raise PageSizeError(f"page_size must be a positive power of two, got {page_size!r}")
        if not isinstance(size, int) or size <= 0 or size % page_size:
            raise ConfigError(
                f"size must be a positive multiple of page_size={page_size} tokens, got {size!r}"
            )
        self.size = size
        self.page_size = page_size
        self.need_sort = bool(need_sort)
        self.rules = rules if rules is not None else Rules()
        self.num_pages = size // page_size
        self.free_pages: list[int] = []
        self.release_pages: list[int] = []
        self._free_set: set[int] = set()
        self._in_free_group = False
        self._pending_free: list[int] = []
        self._pending_pages: list[int] = []  # paged free_page_ids inside a group
        self.clear()

    # ----------------------------------------------------------------- state helpers
    def _set_free_lists(self, free_pages: list[int], release_pages: list[int]) -> None:
        """The one place the free lists change, so the membership set never drifts."""
        self.free_pages = free_pages
        self.release_pages = release_pages
        self._free_set = set(free_pages) | set(release_pages)

    def _return_pages(self, pages: list[int]) -> None:
        """Put freed ``pages`` (already validated) back; subclasses fix the order."""
        raise NotImplementedError

    def _merge_before_take(self, merge_test: bool, num_pages: int) -> None:
        """SGLang's ``need_sort`` merge: when ``merge_test`` (the caller's pre-test on the lengths
        before anything is taken) holds, merge ``release_pages`` in. Skipped when the
        ``num_pages`` would not fit even then and ``refused_alloc_unchanged`` holds, so that a
        refused allocation changes nothing."""
        if not (self.need_sort and merge_test and self.release_pages):
            return
        short = num_pages > len(self.free_pages) + len(self.release_pages)
        if not (short and self.rules.refused_alloc_unchanged):
            self.merge_and_sort_free()

    def _take_pages(self, num_pages: int) -> list[int] | None:
        """Remove ``num_pages`` from the head of ``free_pages``; ``None`` and no change when
        they do not fit (call :meth:`_merge_before_take` first)."""
        if num_pages > len(self.free_pages):
            return None
        taken = self.free_pages[:num_pages]
        self._set_free_lists(self.free_pages[num_pages:], self.release_pages)
        return taken

    def _extend_merge_bound(self, extend_num_tokens: int, batch_size: int) -> int:
        """SGLang's ``alloc_extend`` pre-test bound (pages): ``need_sort`` merges when it
        exceeds ``len(free_pages)``. Paged: ``extend_num_tokens // page_size + batch_size + 1``."""
        return extend_num_tokens // self.page_size + batch_size + 1

    def _slots_of(self, pages: Sequence[int]) -> list[int]:
        ps = self.page_size
        return [page * ps + offset for page in pages for offset in range(ps)]

    def _validate_free(self, slots: Sequence[int], pending: Sequence[int]) -> list[int]:
        """Pages named by ``slots`` in first-seen order, after checking (in this precedence, over
        the whole call): every slot in ``[0, (num_pages + 1) * page_size)`` else
        IndexOutOfRangeError; no slot in page 0 else ReservedIndexError; no page already free,
        and (page size 1) no slot named twice in ``slots`` + ``pending``, else DoubleFreeError."""
        limit = (self.num_pages + 1) * self.page_size
        bad = [s for s in slots if not isinstance(s, int) or s < 0 or s >= limit]
        if bad:
            raise IndexOutOfRangeError(f"slots out of range [0, {limit}): {bad}")
        pages = [s // self.page_size for s in slots]
        reserved = [s for s, p in zip(slots, pages, strict=True) if p == RESERVED_INDEX]
        if reserved:
            raise ReservedIndexError(f"slots of reserved page {RESERVED_INDEX}: {reserved}")
        already_free = sorted({p for p in pages if p in self._free_set})
        if already_free:
            raise DoubleFreeError("freeing pages that are already free", already_free)
        if not self._dedup_pages:
            seen = set(pending)
            twice = []
            for s in slots:
                if s in seen:
                    twice.append(s)
                seen.add(s)
            if twice:
                raise DoubleFreeError("slots freed twice in one call or free group", twice)
        return list(dict.fromkeys(pages))

    # ----------------------------------------------------------------- queries
    def available_size(self) -> int:
        """Free tokens: ``(len(free_pages) + len(release_pages)) * page_size``."""
        return (len(self.free_pages) + len(self.release_pages)) * self.page_size

    def snapshot(self) -> AllocatorSnapshot:
        """Plain copy of the free lists and the free-group state."""
        return _SNAPSHOT(
            page_size=self.page_size,
            num_pages=self.num_pages,
            size=self.size,
            free_pages=tuple(self.free_pages),
            release_pages=tuple(self.release_pages),
            need_sort=self.need_sort,
            in_free_group=self._in_free_group,
            pending_free=tuple(self._pending_free),
        )

    # ----------------------------------------------------------------- alloc / free
    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` slots: ``need_size // page_size`` whole pages from the head of
        ``free_pages``, expanded to slots page by page; ``None`` (no change) if they do not fit.
        Raises InvalidArgumentError for a negative size and AlignmentError (paged) for a size
        that is not a multiple of ``page_size``."""
        self._check_need_size(need_size)
        num_pages = need_size // self.page_size
        self._merge_before_take(num_pages > len(self.free_pages), num_pages)
        pages = self._take_pages(num_pages)
        return None if pages is None else self._slots_of(pages)

    def _check_need_size(self, need_size: int) -> None:
        # A count of tokens: an int (not a bool, not a float to truncate) in [0, 2**63).
        as_count("need_size", need_size)

    def free(self, free_index: Sequence[int]) -> None:
        """Return slots (validated before any change, see :meth:`_validate_free`). Empty input is a
        no-op. Inside a free group the slots are only buffered (validated against the free lists
        and the buffer) until :meth:`free_group_end`. InvalidArgumentError, before any change,
        unless ``free_index`` is a sequence of integers (no bool, float or nested item)."""
        slots = int_list("free_index", free_index)
        if not slots:
            return
        pending = self._pending_free if self._in_free_group else []
        pages = self._validate_free(slots, pending)
        if self._in_free_group:
            self._pending_free.extend(slots)
            return
        self._return_pages(pages)

    def _return_pages_in_order(self, pages: list[int]) -> None:
        """Put ``pages`` back in the given order (page size 1: as :meth:`_return_pages`)."""
        self._return_pages(pages)

    def free_group_begin(self) -> None:
        """Start buffering frees. Not nestable: a second begin raises InvalidArgumentError."""
        if self._in_free_group:
            raise InvalidArgumentError("free_group_begin inside an open free group")
        self._in_free_group = True
        self._pending_free = []
        self._pending_pages = []

    def free_group_end(self) -> None:
        """Close the group and perform its buffered frees as ONE :meth:`free` of their
        concatenation (so the paged allocator de-duplicates pages across the whole group), then
        return the pages buffered by a paged ``free_page_ids`` in their order (SGLang 0.5.23).
        Raises InvalidArgumentError without an open group; if the buffered frees are no longer
        valid (a ``restore_state`` in between, or a page buffered both ways: DoubleFreeError),
        raises their error and leaves the group open."""
        if not self._in_free_group:
            raise InvalidArgumentError("free_group_end without free_group_begin")
        pending, staged = self._pending_free, self._pending_pages
        pages = self._validate_free(pending, []) if pending else []
        if staged:
            self._validate_free(self._slots_of(staged)[:: self.page_size], [])
            twice = sorted(set(pages) & set(staged))
            if twice:
                raise DoubleFreeError("pages freed twice in one free group", twice)
        self._in_free_group = False
        self._pending_free = []
        self._pending_pages = []
        if pages:
            self._return_pages(pages)
        if staged:
            self._return_pages_in_order(staged)

    # ----------------------------------------------------------------- segment frees (0.5.23)
    def free_page_ids(self, page_ids: Sequence[int]) -> None:
        """Free exactly these pages, in the given order (SGLang 0.5.23): no sort and no
        de-duplication (a page named twice is a double free). Paged: they go in front of
        ``free_pages`` as given. Inside a free group a paged allocator buffers them apart and
        returns them, in order, after the group's slot frees (as 0.5.23); page size 1 buffers
        them with the slot frees (0.5.23's token allocator frees segments with ``free``).
        InvalidArgumentError unless ``page_ids`` is a sequence of integers (a float page id is
        refused, never truncated); every page must be held (the free checks, on its first
        slot)."""
        pages = int_list("page_ids", page_ids)
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
        order, through :meth:`free_page_ids` (SGLang 0.5.23's tree frees). ``start_pos`` is a
        column (an int >= 0) and ``free_index`` a sequence of integers (InvalidArgumentError);
        each run of ``page_size`` slots from the start must lie in one page, or the pages after
        a run's first slot would leak (InvalidArgumentError, SGLang's debug-mode check)."""
        slots = int_list("free_index", free_index)
        start = as_count("start_pos", start_pos)
        if not slots:
            return
        if start % self.page_size:
            raise AlignmentError(f"segment start {start_pos} is not page-aligned")
        self._validate_free(slots, [])
        self._check_segment_runs(slots)
        self.free_page_ids([s // self.page_size for s in slots[:: self.page_size]])

    def _check_segment_runs(self, slots: Sequence[int]) -> None:
        """Every run ``slots[k * ps : (k + 1) * ps]`` lies in the page of its first slot (slots
        already range-checked): the segment frees one page per run."""
        ps = self.page_size
        if ps == 1:
            return
        for i, s in enumerate(slots):
            head = slots[i - i % ps]
            if s // ps != head // ps:
                raise InvalidArgumentError(
                    f"free_index: slot {s} at position {i} is not in the page of its run's first "
                    f"slot {head} (page_size={ps})"
                )

    # ----------------------------------------------------------------- batch allocations
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
        as_count("extend_num_tokens", extend_num_tokens)  # never 2.0 == 2 by accident
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

    # ----------------------------------------------------------------- free-list state
    def backup_state(self) -> FreeListState:
        """``(free_pages, release_pages)`` as tuples (EAGLE v1 borrows draft slots with it)."""
        return (tuple(self.free_pages), tuple(self.release_pages))

    def restore_state(self, state: object) -> None:
        """Put back free lists taken by :meth:`backup_state`. Raises InvalidArgumentError for
        anything but two sequences of distinct integer page ids in ``1..num_pages`` (a bool or
        a float page id included)."""
        if not isinstance(state, tuple) or len(state) != 2:
            raise InvalidArgumentError(
                f"state must be the (free_pages, release_pages) tuple, got {state!r}"
            )
        free_pages = int_list("state[0] (free_pages)", state[0])
        release_pages = int_list("state[1] (release_pages)", state[1])
        every = free_pages + release_pages
        bad = [p for p in every if not RESERVED_INDEX < p <= self.num_pages]
        if bad or len(set(every)) != len(every):
            raise InvalidArgumentError(f"state holds bad or repeated page ids: {bad or every}")
        self._set_free_lists(free_pages, release_pages)

    def merge_and_sort_free(self) -> None:
        """``free_pages = sorted(free_pages + release_pages)``; ``release_pages = []``. A no-op
        when ``release_pages`` is empty (``free_pages`` keeps its order), as in SGLang."""
        if self.release_pages:
            self._set_free_lists(sorted(self.free_pages + self.release_pages), [])

    def clear(self) -> None:
        """Every page free (ids ascending), no release pages, no open free group."""
        self._set_free_lists(list(range(RESERVED_INDEX + 1, self.num_pages + 1)), [])
        self._in_free_group = False
        self._pending_free = []
        self._pending_pages = []


__all__ = ["BaseTokenToKVPoolAllocator", "FreeListState"]

"""``BaseTokenToKVPoolAllocator`` (optimized twin): what the token-slot allocators share.

The page-size-1 ``TokenToKVPoolAllocator`` (:mod:`kvpool.optimized.pools.token_allocator`) and
the ``PagedTokenToKVPoolAllocator`` (:mod:`kvpool.optimized.pools.paged_allocator`) derive from it
and fix only the order freed pages re-enter the free lists; the rest lives here, as in
:mod:`kvpool.reference.pools.allocator`: free lists, ``alloc`` / ``free``, free groups, the batch
``alloc_extend`` / ``alloc_decode`` and 0.5.23's segment frees (``free_page_ids`` /
``free_segment``).

Units: ``size`` and lengths are tokens; ``free_pages`` / ``release_pages`` are int64 tensors of
page ids ``1..num_pages`` on ``device`` (page ``p`` owns slots ``[p * ps, (p + 1) * ps)``); every
result is an int64 slot tensor equal, element by element, to the reference's list.

The free lists are a :class:`~kvpool.optimized.pools.free_list.FreeList` (``free_pages`` in
windows, so that a free copies the freed pages only and a take is one view; views handed out
never change, and a restored backup is never written).

Hot paths launch tensor work only: page counts come from host copies of the lengths
(:mod:`kvpool.optimized.pools.paged_ops`), capacity is compared with tensor lengths (host metadata),
and the batch operations run :func:`kvpool.kernels.alloc_extend` / ``alloc_decode`` through the
kernels' unchecked entries (``*_unchecked``): what the kernels need of the metadata is established
here (lengths made 1-D on the device by ``_as_index``, integer dtypes and one batch size for them
and their host copies checked, the allocator's own pages and int64 output), so the hot path does
not pay for the wrappers' checks too. No device-to-host sync, unless ``checked`` (see
:mod:`kvpool.optimized.checked`): then every misuse raises the reference's error before any
change, using a device bool mask of free pages kept up to date incrementally. Checks that need no
device read (dtypes, array lengths, the host copies of the lengths:
:func:`~kvpool.optimized.pools.paged_ops.check_extend_host`) run in both modes.

``need_sort`` merges and refusals follow the reference (SGLang's pre-tests on host lengths; see
:mod:`kvpool.reference.pools.allocator`) and ``rules`` (:class:`~kvpool.rules.Rules`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from kvpool.constants import is_power_of_two
from kvpool.errors import (
    AlignmentError,
    ConfigError,
    InvalidArgumentError,
    PageSizeError,
)
from kvpool.host_checks import INT64_MAX, as_count
from kvpool.kernels.alloc_decode import alloc_decode_unchecked, next_slots_if_torch
from kvpool.kernels.alloc_extend import alloc_extend_host, alloc_extend_unchecked
from kvpool.kernels.host import HostLens
from kvpool.optimized.host_view import store_at
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.key_match import is_integer_dtype
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.optimized.pools.free_list import FreeList, joined_parts
from kvpool.optimized.pools.paged_ops import (
    check_decode_args,
    check_decode_host,
    check_extend_batch,
    check_extend_host,
    check_free_list_shape,
    check_free_list_state,
    check_free_slots,
    check_host_copy,
    check_integer_tensors,
    check_segment_runs,
    check_slot_range,
    decode_host_fast,
    extend_new_pages_host,
    pages_to_slots,
)
from kvpool.records import fast_record
from kvpool.rules import Rules
from kvpool.snapshot import AllocatorSnapshot

_SNAPSHOT = fast_record(AllocatorSnapshot)
"""Builds an :class:`AllocatorSnapshot` (every field by keyword: :func:`fast_record`)."""

FreeListState = tuple[torch.Tensor, torch.Tensor]
"""What :meth:`BaseTokenToKVPoolAllocator.backup_state` returns: ``(free_pages, release_pages)``."""

IndexLike = torch.Tensor | Sequence[int]
"""Slots or page ids: a tensor (any device) or a sequence of ints."""

_TENSOR = torch.Tensor
_INT64 = torch.int64
"""Module-level names for the hot paths' type tests (an attribute of ``torch`` costs a lookup)."""


class BaseTokenToKVPoolAllocator:
    """Page allocator over ``size // page_size`` pages with ids ``1..num_pages`` (twin of
    :class:`kvpool.reference.pools.allocator.BaseTokenToKVPoolAllocator`; same methods and results).

    ``options`` (:class:`~kvpool.optimized.options.TwinOptions`; None: the defaults) place the
    free lists, set checked mode and the kernels' backend."""

    _dedup_pages: bool = True
    """True: freeing two slots of one page (in a call or a group) frees the page once."""

    _appends_freed: bool = False
    """True: freed pages go to the tail of ``free_pages`` (page size 1), else to its head."""

    def __init__(
        self,
        size: int,
        page_size: int,
        need_sort: bool = False,
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
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
        self.options = opts = twin_options(options)
        self.device = opts.device
        self.checked = opts.checked
        self.kernel_backend = opts.backend
        self._on_cpu = self.device.type == "cpu"  # a tensor's is_cpu is cheaper than its device
        self._offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        # free_pages and release_pages: windows and parts, so that no free copies the list.
        self._free_list = FreeList(self.device, self._appends_freed)
        # Checked mode only: free_mask[page] is True while the page is in either free list;
        # pending_mask[slot] (page size 1) while the slot waits in the open free group.
        self._free_mask: torch.Tensor | None = None
        self._pending_mask: torch.Tensor | None = None
        if self.checked:
            self._free_mask = torch.zeros(self.num_pages + 1, dtype=torch.bool, device=self.device)
            if not self._dedup_pages:
                self._pending_mask = torch.zeros_like(self._free_mask)
        self._in_free_group = False
        self._owned: torch.Tensor | None = None  # free_group_end's concatenation, while returned
        self._pending_free: list[torch.Tensor] = []
        self._buffer_as_is: list[torch.Tensor] | None = None  # unchecked in a group: _pending_free
        self._pending_pages: list[torch.Tensor] = []  # paged free_page_ids inside a group
        self.clear()

    # ----------------------------------------------------------------- state helpers
    def _empty(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)

    def _as_index(self, values: IndexLike, name: str = "free_index") -> torch.Tensor:
        """Slots/lengths as a 1-D integer tensor on the device (no copy when already there);
        InvalidArgumentError, in both modes, for anything else (a float, bool or 2-D tensor,
        ``None``, a number, a list holding non-integers: :func:`index_tensor`)."""
        if (
            type(values) is torch.Tensor
            and values.dim() == 1
            and (values.is_cpu if self._on_cpu else values.device == self.device)
            and is_integer_dtype(values.dtype)
        ):
            return values  # the common case, without the conversion's per-call cost
        if isinstance(values, torch.Tensor) and values.dim() == 1 and values.numel() == 0:
            return self._empty()  # torch.tensor([]) is float32 but names nothing to misread
        return index_tensor(name, values, self.device)

    def _check_host_slots(self, given: object, slots: torch.Tensor) -> None:
        """Unchecked mode, slots a caller gave as host values (not a tensor): the reference's
        range and reserved-page checks, which read no device data for them."""
        if self._free_mask is None and not isinstance(given, torch.Tensor):
            check_slot_range(slots, self.num_pages, self.page_size)

    @property
    def free_pages(self) -> torch.Tensor:
        """The free list (int64 page ids, in order): a view, made on first read after a change.
        Never written in place: a view read once keeps its values."""
        return self._free_list.pages

    @free_pages.setter
    def free_pages(self, pages: torch.Tensor) -> None:
        # Someone's tensor (a restored backup, a sort, a test's): read, never written.
        self._free_list.pages = pages

    @property
    def release_pages(self) -> torch.Tensor:
        """The ``need_sort`` staging list (int64 page ids, in order), joined on first read."""
        return self._free_list.release

    @release_pages.setter
    def release_pages(self, pages: torch.Tensor) -> None:
        self._free_list.release = pages

    def _set_free_lists(
        self,
        free_pages: torch.Tensor,
        release_pages: torch.Tensor,
        host: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """Replace both free lists (see :meth:`FreeList.replace`: ``host``, the numpy array
        ``free_pages`` was made from, else None) and rebuild the checked-mode mask."""
        self._free_list.replace(free_pages, release_pages, host)
        if self._free_mask is not None:
            self._free_mask.zero_()
            self._set_free(free_pages, True)
            self._set_free(release_pages, True)

    def _return_pages(self, slots: torch.Tensor) -> None:
        """Put the pages of freed ``slots`` (already validated) back; subclasses fix the order."""
        raise NotImplementedError

    def _mark_free(self, pages: torch.Tensor) -> None:
        if self._free_mask is not None:
            self._set_free(pages, True)

    def _set_free(self, pages: torch.Tensor, free: bool) -> None:
        """``free_mask[pages] = free`` (checked mode only): through NumPy views when both live
        on the CPU (no tensor operation), else one indexed store."""
        assert self._free_mask is not None, "only checked mode keeps the mask"
        store_at(self._free_mask, pages, free)

    def _merge_before_take(self, merge_test: bool, num_pages: int) -> None:
        """SGLang's ``need_sort`` merge when its pre-test ``merge_test`` holds (see the
        reference); skipped when the allocation would still be refused and
        ``refused_alloc_unchanged`` holds. Lengths are tensor shapes: no sync."""
        if not (self.need_sort and merge_test and self._free_list.release_count > 0):
            return
        short = num_pages > self._free_list.count() + self._free_list.release_count
        if not (short and self.rules.refused_alloc_unchanged):
            self.merge_and_sort_free()

    def _take_pages(self, num_pages: int) -> torch.Tensor | None:
        """Remove ``num_pages`` from the head of ``free_pages``; ``None`` and no change when
        they do not fit (call :meth:`_merge_before_take` first)."""
        taken = self._free_list.take(num_pages)
        if taken is not None and self._free_mask is not None:
            self._set_free(taken, False)
        return taken

    def _extend_merge_bound(self, extend_num_tokens: int, batch_size: int) -> int:
        """SGLang's ``alloc_extend`` pre-test bound in pages (see the reference)."""
        return extend_num_tokens // self.page_size + batch_size + 1

    # ----------------------------------------------------------------- queries
    def available_size(self) -> int:
        """Free tokens: ``(len(free_pages) + len(release_pages)) * page_size``."""
        return (self._free_list.count() + self._free_list.release_count) * self.page_size

    def snapshot(self) -> AllocatorSnapshot:
        """Plain copy of the free lists and the free-group state (device-to-host copies; none,
        and no empty tensor made, for an empty staging list or group)."""
        pending = self._pending_slots().tolist() if self._pending_free else []
        release = self.release_pages.tolist() if self._free_list.release_count else []
        return _SNAPSHOT(
            page_size=self.page_size,
            num_pages=self.num_pages,
            size=self.size,
            free_pages=tuple(self.free_pages.tolist()),
            release_pages=tuple(release),
            need_sort=self.need_sort,
            in_free_group=self._in_free_group,
            pending_free=tuple(pending),
        )

    # ----------------------------------------------------------------- alloc / free
    def _check_need_size(self, need_size: int) -> None:
        # A count of tokens: an int (not a bool, not a float to truncate) in [0, 2**63).
        as_count("need_size", need_size)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots: ``need_size // page_size`` whole pages from the head of
        ``free_pages``, expanded page by page; ``None`` (no change) if they do not fit.
        InvalidArgumentError for a negative size."""
        if type(need_size) is not int or not 0 <= need_size <= INT64_MAX:
            self._check_need_size(need_size)  # the full check; a plain int in range needs none
        num_pages = need_size // self.page_size
        if self.need_sort:
            self._merge_before_take(num_pages > self._free_list.count(), num_pages)
        pages = self._take_pages(num_pages)
        if pages is None or self.page_size == 1:
            return pages
        return pages_to_slots(pages, self._offsets)

    def free(self, free_index: IndexLike) -> None:
        """Return slots. Empty input is a no-op. Inside a free group the slots are only buffered
        until :meth:`free_group_end`. Checked mode validates first, as the reference.

        Unchecked, a 1-D int64 tensor needs no conversion and no check: inside a group it is
        buffered as it is, an empty one too (no tensor operation: the lifecycle frees one tensor
        per request there; one on another device is moved when the group ends), outside (on the
        device) its pages go back at once; anything else is converted and checked first."""
        buffer = self._buffer_as_is
        if buffer is not None:
            try:  # two attribute reads decide (a list has no dtype: the general path)
                if free_index.dtype is _INT64 and free_index.ndim == 1:  # type: ignore[union-attr]
                    buffer.append(free_index)  # type: ignore[arg-type]
                    return
            except AttributeError:
                pass
        elif (  # unchecked, outside a group (inside one, the buffer above is set)
            self._free_mask is None
            and type(free_index) is _TENSOR
            and free_index.dtype is _INT64
            and free_index.ndim == 1
            and (free_index.is_cpu if self._on_cpu else free_index.device == self.device)
        ):
            if free_index.numel():
                self._return_pages(free_index)
            return
        slots = self._as_index(free_index)  # metadata: checked in both modes
        if slots.numel() == 0:
            return
        self._check_host_slots(free_index, slots)
        if self._free_mask is not None:
            check_free_slots(
                slots, self._free_mask, self.page_size, not self._dedup_pages, self._pending_mask
            )
        if slots.dtype is not torch.int64:
            slots = slots.to(torch.int64)
        if self._in_free_group:
            self._pending_free.append(slots)
            if self._pending_mask is not None:
                self._pending_mask[slots] = True
            return
        self._return_pages(slots)

    def _return_pages_in_order(self, pages: torch.Tensor) -> None:
        """Put ``pages`` back in the given order (page size 1: as :meth:`_return_pages`)."""
        self._return_pages(pages)

    def free_group_begin(self) -> None:
        """Start buffering frees. Not nestable: a second begin raises InvalidArgumentError."""
        if self._in_free_group:
            raise InvalidArgumentError("free_group_begin inside an open free group")
        self._in_free_group = True
        self._pending_free = []
        self._buffer_as_is = self._pending_free if self._free_mask is None else None
        self._pending_pages = []

    def free_group_end(self) -> None:
        """Close the group and perform its buffered frees as ONE :meth:`free` of their
        concatenation, then return the pages a paged ``free_page_ids`` buffered, in order (see
        the reference). InvalidArgumentError without an open group; in checked mode, buffered
        frees that are no longer valid (or a page buffered both ways) raise their error and
        leave the group open."""
        if not self._in_free_group:
            raise InvalidArgumentError("free_group_end without free_group_begin")
        ps = self.page_size
        slots = self._pending_slots()
        staged = joined_parts(self._pending_pages, self.device, self._on_cpu)
        if self._free_mask is not None and slots.numel():
            check_free_slots(slots, self._free_mask, ps, not self._dedup_pages)
        if self._free_mask is not None and staged.numel():
            firsts = torch.cat((torch.unique(slots // ps), staged)) * ps
            check_free_slots(firsts, self._free_mask, ps, True)
        if slots.numel():  # first: a refusal here (unchecked) leaves the group as it was
            # A concatenation is the allocator's own: page size 1 may keep it as its tail
            # window instead of copying it (FreeList.append).
            self._owned = slots if len(self._pending_free) > 1 else None
            try:
                self._return_pages(slots)
            finally:
                self._owned = None
        if staged.numel():
            self._return_pages_in_order(staged)
        self._close_group()

    def _pending_slots(self) -> torch.Tensor:
        """The open group's buffered slots as one int64 tensor on the device, in order (no copy
        for a single one); tensors buffered from another device are moved here."""
        return joined_parts(self._pending_free, self.device, self._on_cpu)

    # ----------------------------------------------------------------- segment frees (0.5.23)
    def free_page_ids(self, page_ids: IndexLike) -> None:
        """Free exactly these pages, in the given order (see the reference); inside a free
        group a paged allocator buffers them apart (returned after the group's slot frees),
        page size 1 with the slot frees."""
        pages = self._as_index(page_ids, "page_ids")
        if pages.numel() == 0:
            return
        if self._free_mask is None and not isinstance(page_ids, torch.Tensor):
            check_slot_range(pages * self.page_size, self.num_pages, self.page_size)
        if pages.dtype is not torch.int64:
            pages = pages.to(torch.int64)
        self._free_page_ids(pages)

    def _free_page_ids(self, pages: torch.Tensor) -> None:
        """:meth:`free_page_ids` after its argument checks: ``pages`` a non-empty 1-D int64
        tensor on the device (``free_segment`` comes here straight: its pages come from slots
        it has checked)."""
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
        AlignmentError): one page per ``page_size`` slots, in order (see the reference).
        ``start_pos`` must be an int >= 0 (InvalidArgumentError, both modes); checked mode (or
        slots given as host values) also checks that each run of ``page_size`` slots lies in
        one page."""
        slots = self._as_index(free_index)
        start = (  # a plain int in range needs no call
            start_pos
            if type(start_pos) is int and 0 <= start_pos <= INT64_MAX
            else as_count("start_pos", start_pos)
        )
        if slots.numel() == 0:
            return
        if slots.dtype is not torch.int64:
            slots = slots.to(torch.int64)
        ps = self.page_size
        if start % ps:
            raise AlignmentError(f"segment start {start_pos} is not page-aligned")
        self._check_host_slots(free_index, slots)
        if self._free_mask is not None:
            check_free_slots(slots, self._free_mask, ps, False, None)
        if self._free_mask is not None or not isinstance(free_index, torch.Tensor):
            check_segment_runs(slots, ps)
        if ps == 1:  # every slot is its own page
            self._free_page_ids(slots)
            return
        # ps is a power of two: a shift is the floor division, one tensor operation cheaper
        self._free_page_ids(slots[::ps] >> (ps.bit_length() - 1))

    # ----------------------------------------------------------------- batch allocations
    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: HostLens,
        seq_lens: torch.Tensor,
        seq_lens_cpu: HostLens,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Slots (int64, length ``extend_num_tokens``) for tokens ``[P_i, S_i)`` of every
        request, in batch order, or ``None`` (no change) when the new pages do not fit. The page
        count comes from the host copies; capacity is checked before the kernel is launched.
        Checked mode raises the reference's errors for a bad batch; so does unchecked mode for
        the value checks that need no free list when the lengths or ``last_loc`` come as host
        values (lists: no device read). Types, shapes and ``extend_num_tokens`` (an int >= 0):
        InvalidArgumentError in both modes."""
        host_given = not (
            isinstance(prefix_lens, torch.Tensor)
            and isinstance(seq_lens, torch.Tensor)
            and isinstance(last_loc, torch.Tensor)
        )
        prefix_lens = self._as_index(prefix_lens, "prefix_lens")
        seq_lens = self._as_index(seq_lens, "seq_lens")
        last_loc = self._as_index(last_loc, "last_loc")
        as_count("extend_num_tokens", extend_num_tokens)
        full = self._free_mask is not None or host_given  # value checks on the lengths
        if full:  # the reference's order of checks
            check_integer_tensors(prefix_lens=prefix_lens, seq_lens=seq_lens, last_loc=last_loc)
            p = check_host_copy("prefix_lens", prefix_lens, prefix_lens_cpu)
            s = check_host_copy("seq_lens", seq_lens, seq_lens_cpu)
            loc = last_loc.to(torch.int64)
            check_extend_batch(p, s, loc, extend_num_tokens, self._free_mask, self.page_size)
        host_p, host_s = check_extend_host(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, full
        )  # full: check_extend_batch made these checks; only the host copies are read
        num_new = extend_new_pages_host(host_p, host_s, self.page_size)
        bound = self._extend_merge_bound(extend_num_tokens, host_s.size)  # the checked copy
        self._merge_before_take(bound > self._free_list.count(), num_new)
        pages = self._take_pages(num_new)
        if pages is None:
            return None
        out = torch.empty(extend_num_tokens, dtype=torch.int64, device=self.device)
        if self._free_mask is not None and alloc_extend_host(
            host_p, host_s, last_loc, pages, out, self.page_size
        ):  # checked mode on the CPU: the same plan in NumPy (it reads the host anyway)
            return out
        alloc_extend_unchecked(
            prefix_lens,
            seq_lens,
            last_loc,
            pages,
            out,
            self.page_size,
            self.kernel_backend,
            prefix_lens_cpu=prefix_lens_cpu,
            seq_lens_cpu=seq_lens_cpu,
        )
        return out

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: HostLens, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """One slot per request (int64) for token ``S_i - 1``: the first slot of the next free
        page when ``(S_i - 1) % page_size == 0``, else ``last_loc_i + 1``; ``None`` (no change)
        if the new pages do not fit. Checked mode raises the reference's errors (unchecked mode
        too, but for a free page, when ``seq_lens`` or ``last_loc`` come as host values); types
        and shapes: InvalidArgumentError in both modes."""
        host_s = (
            None
            if self._free_mask is not None  # checked mode: the general path checks everything
            else decode_host_fast(seq_lens, seq_lens_cpu, last_loc, self.device, self._on_cpu)
        )
        if host_s is None:  # anything but the engine's usual arguments: the general path
            host_given = not (
                isinstance(seq_lens, torch.Tensor) and isinstance(last_loc, torch.Tensor)
            )
            seq_lens = self._as_index(seq_lens, "seq_lens")
            last_loc = self._as_index(last_loc, "last_loc")
            if self._free_mask is not None or host_given:  # the reference's order of checks
                check_integer_tensors(seq_lens=seq_lens, last_loc=last_loc)
                s = check_host_copy("seq_lens", seq_lens, seq_lens_cpu)
                loc = last_loc.to(torch.int64)
                check_decode_args(s, loc, self._free_mask, self.page_size)
            host_s = check_decode_host(seq_lens, seq_lens_cpu, last_loc)  # the checked copy
        if self.page_size == 1:
            # Every request opens a page: its slot is the next free page, in batch order, so the
            # slots are the taken pages themselves (a view of the free list, as alloc returns).
            bs = int(host_s.size)
            if self.need_sort:
                self._merge_before_take(bs > self._free_list.count(), bs)
            return self._take_pages(bs)
        # page_opening_requests on the checked host copy, inline: (S - 1) % ps == 0
        opens = ((host_s & (self.page_size - 1)) == 1).nonzero()[0]
        num_new = int(opens.size)
        bs = int(host_s.size)
        if self.need_sort:
            self._merge_before_take(bs > self._free_list.count(), num_new)
        if num_new:
            pages = self._take_pages(num_new)
            if pages is None:
                return None
        else:  # no request opens a page (most decode steps): the free list stays as it is
            quick = next_slots_if_torch(last_loc, self.kernel_backend)
            if quick is not None:
                return quick
            pages = self.free_pages
        out = torch.empty(bs, dtype=torch.int64, device=self.device)
        alloc_decode_unchecked(
            seq_lens,
            last_loc,
            pages,
            out,
            self.page_size,
            self.kernel_backend,
            seq_lens_cpu=seq_lens_cpu,
            opens_cpu=opens,
        )
        return out

    # ----------------------------------------------------------------- free-list state
    def backup_state(self) -> FreeListState:
        """``(free_pages, release_pages)`` as clones (EAGLE v1 borrows draft slots with it).
        On the CPU the free list's copy is made by numpy and restoring it needs no copy
        (:meth:`FreeList.backup`)."""
        return self._free_list.backup()

    def restore_state(self, state: object) -> None:
        """Put back free lists taken by :meth:`backup_state`. Checked mode raises
        InvalidArgumentError for anything but two tensors of distinct page ids in
        ``1..num_pages``."""
        free_pages: IndexLike
        release_pages: IndexLike
        if self.checked:
            free_pages, release_pages = check_free_list_state(state, self.num_pages)
        else:  # the shape of the state (host metadata), not its page ids
            free_pages, release_pages = check_free_list_shape(state)
        self._set_free_lists(
            self._as_index(free_pages).to(torch.int64),
            self._as_index(release_pages).to(torch.int64),
        )

    def merge_and_sort_free(self) -> None:
        """``free_pages = sorted(free_pages + release_pages)``; ``release_pages`` empty. A no-op
        when ``release_pages`` is empty."""
        if self._free_list.release_count == 0:
            return
        self._free_list.merge_and_sort(self.num_pages)

    def clear(self) -> None:
        """Every page free (ids ascending), no release pages, no open free group."""
        every, host = self._free_list.every_page(self.num_pages)  # on the CPU: numpy-made
        self._set_free_lists(every, self._empty(), host)
        self._close_group()

    def _close_group(self) -> None:
        """No open free group, nothing buffered."""
        self._in_free_group = False
        self._pending_free = []
        self._buffer_as_is = None
        self._pending_pages = []
        if self._pending_mask is not None:
            self._pending_mask.zero_()


__all__ = ["BaseTokenToKVPoolAllocator", "FreeListState"]

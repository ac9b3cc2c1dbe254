"""``SWAFrees`` (optimized twin): how the SWA hybrid allocator releases slots, a mixin of
:class:`~kvpool.optimized.swa.allocator.SWATokenToKVPoolAllocator`.

Twin of :mod:`kvpool.reference.swa.free` (read its module docstring for the contract and
``Rules.swa_free_resolve``). A free reads the mapping and drops the sentinel entries with a
mask, whose data-dependent size waits for the device (SGLang's free does the same); at page
size > 1 the freed pages are expanded to their slots once each, in ascending order. ``checked``
validates every call as the reference does, before any change. SGLang 0.5.23's split frees
(``free_full``, ``free_full_segment``, ``free_swa_segment``, ``free_segment``) read the first
slot of each page and free pages in the given order, as the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import AlignmentError, IndexOutOfRangeError, InvalidArgumentError, KVPoolError
from kvpool.optimized.pools.paged_ops import check_free_slots

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvpool.optimized.pools.allocator import BaseTokenToKVPoolAllocator
    from kvpool.rules import Rules

    IndexLike = torch.Tensor | Sequence[int]


class SWAFrees:
    """``free``, ``free_swa`` and the free group of the SWA allocator (module docstring)."""

    full_attn_allocator: BaseTokenToKVPoolAllocator
    swa_attn_allocator: BaseTokenToKVPoolAllocator
    full_to_swa_index_mapping: torch.Tensor
    page_size: int
    checked: bool
    rules: Rules
    _offsets: torch.Tensor
    _in_free_group: bool
    _group_slots: list[torch.Tensor]

    def _as_index(
        self, values: IndexLike, error: type[KVPoolError] = InvalidArgumentError
    ) -> torch.Tensor:
        raise NotImplementedError

    def _check_range(self, slots: torch.Tensor, low: int) -> None:
        raise NotImplementedError

    def _resolves_at_group_end(self) -> bool:
        return self.rules.swa_free_resolve == "group_end"

    def _mapping_indices(self, slots: torch.Tensor) -> torch.Tensor:
        """The full slots a free of ``slots`` resolves: every slot of their pages above page
        size 1, each page once, in the order the slots first name them (as the reference; the
        sentinel mask that follows waits for the device anyway, so the ``unique`` adds no sync
        of its own)."""
        if self.page_size == 1:
            return slots
        named = slots // self.page_size
        uniq, inverse = torch.unique(named, return_inverse=True)
        where = torch.arange(named.numel(), device=named.device)
        first = torch.full_like(uniq, named.numel()).scatter_reduce_(0, inverse, where, "amin")
        pages: torch.Tensor = uniq[torch.argsort(first)]
        out: torch.Tensor = (pages.unsqueeze(1) * self.page_size + self._offsets).reshape(-1)
        return out

    def _resolve_swa(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mapping indices, their SWA slots other than the sentinel); checked mode validates
        the SWA slots against the SWA allocator."""
        indices = self._mapping_indices(slots)
        swa = self.full_to_swa_index_mapping[indices]
        swa = swa[swa != RESERVED_INDEX]  # the sentinel is no slot
        inner = self.swa_attn_allocator
        if inner._free_mask is not None and swa.numel():
            check_free_slots(
                swa, inner._free_mask, self.page_size, not inner._dedup_pages, inner._pending_mask
            )
        return indices, swa

    def _release_swa(self, indices: torch.Tensor, swa: torch.Tensor) -> None:
        self.full_to_swa_index_mapping.index_fill_(0, indices, RESERVED_INDEX)
        self.swa_attn_allocator.free(swa)

    def free(self, free_index: IndexLike) -> None:
        """Free full slots and the SWA slots their mapping names, zeroing those entries; inside
        a free group as ``Rules.swa_free_resolve`` says. Checked mode validates both sides
        first."""
        slots = self._as_index(free_index, IndexOutOfRangeError)
        if slots.numel() == 0:
            return
        full_alloc = self.full_attn_allocator
        if full_alloc._free_mask is not None:
            check_free_slots(
                slots,
                full_alloc._free_mask,
                self.page_size,
                not full_alloc._dedup_pages,
                full_alloc._pending_mask,
            )
        if self._in_free_group and self._resolves_at_group_end():
            full_alloc.free(slots)  # buffered; the entries are read at free_group_end
            self._group_slots.append(slots)
            return
        indices, swa = self._resolve_swa(slots)
        full_alloc.free(slots)
        self._release_swa(indices, swa)

    def free_swa(self, free_index: IndexLike) -> None:
        """Free only the SWA slots of full slots (tokens that slid out of the window), zeroing
        their entries; slots mapped to 0 are skipped. Checked mode: IndexOutOfRangeError for a
        slot outside the full pool, the SWA allocator's errors for a corrupt mapping."""
        slots = self._as_index(free_index, IndexOutOfRangeError)
        if slots.numel() == 0:
            return
        if self.checked:
            self._check_range(slots, 0)
        indices, swa = self._resolve_swa(slots)
        self._release_swa(indices, swa)

    def _check_unmapped(self, slots: torch.Tensor) -> None:
        if self.checked:
            self._check_range(slots, 0)
            mapped = slots[self.full_to_swa_index_mapping[slots] != RESERVED_INDEX]
            if mapped.numel():
                raise InvalidArgumentError(
                    f"full slots still holding an SWA slot: {mapped.tolist()}"
                )

    def free_full(self, free_index: IndexLike) -> None:
        """Free full slots whose SWA slots were released already (see the reference); checked
        mode: InvalidArgumentError for a slot still mapped."""
        slots = self._as_index(free_index, IndexOutOfRangeError)
        if slots.numel() == 0:
            return
        self._check_unmapped(slots)
        self.full_attn_allocator.free(slots)

    def free_full_segment(self, free_index: IndexLike, start_pos: int = 0) -> None:
        """:meth:`free_full` of a kv-row segment (the full pool's ``free_segment``)."""
        slots = self._as_index(free_index, IndexOutOfRangeError)
        if slots.numel() == 0:
            return
        self._check_unmapped(slots)
        self.full_attn_allocator.free_segment(slots, start_pos)

    def _segment_swa_pages(
        self, slots: torch.Tensor, start_pos: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mapping indices, SWA pages) of a segment free (see the reference)."""
        ps = self.page_size
        if start_pos % ps:
            raise AlignmentError(f"segment start {start_pos} is not page-aligned")
        if self.checked:
            self._check_range(slots, 0)
        firsts = slots[::ps]
        named = self.full_to_swa_index_mapping[firsts]
        live = named != RESERVED_INDEX
        firsts, named = firsts[live], named[live]
        indices = ((firsts // ps * ps).unsqueeze(1) + self._offsets).reshape(-1)
        pages = named // ps
        inner = self.swa_attn_allocator
        if inner._free_mask is not None and pages.numel():
            check_free_slots(pages * ps, inner._free_mask, ps, True, None)
        return indices, pages

    def free_swa_segment(self, free_index: IndexLike, start_pos: int = 0) -> None:
        """Free the SWA pages of a kv-row segment, zeroing their entries (see the reference)."""
        slots = self._as_index(free_index, IndexOutOfRangeError)
        if slots.numel() == 0:
            return
        indices, pages = self._segment_swa_pages(slots, start_pos)
        self.full_to_swa_index_mapping.index_fill_(0, indices, RESERVED_INDEX)
        self.swa_attn_allocator.free_page_ids(pages)

    def free_segment(self, free_index: IndexLike, start_pos: int = 0) -> None:
        """Both pools' pages of a kv-row segment: the SWA side, then the full pool's
        ``free_segment`` (checked mode validates both first)."""
        slots = self._as_index(free_index, IndexOutOfRangeError)
        if slots.numel() == 0:
            return
        full_alloc = self.full_attn_allocator
        if full_alloc._free_mask is not None:
            check_free_slots(slots, full_alloc._free_mask, self.page_size, False, None)
        indices, pages = self._segment_swa_pages(slots, start_pos)
        self.full_to_swa_index_mapping.index_fill_(0, indices, RESERVED_INDEX)
        self.swa_attn_allocator.free_page_ids(pages)
        full_alloc.free_segment(slots, start_pos)

    def free_group_begin(self) -> None:
        """Open a free group (both pools; the full pool only under ``"group_end"``).
        InvalidArgumentError when one is open."""
        if self._in_free_group:
            raise InvalidArgumentError("free_group_begin inside an open free group")
        self.full_attn_allocator.free_group_begin()
        if not self._resolves_at_group_end():
            self.swa_attn_allocator.free_group_begin()
        self._in_free_group = True
        self._group_slots = []

    def free_group_end(self) -> None:
        """Close the group: each pool performs its buffered frees as one free (under
        ``"group_end"``: the full slots, then the SWA slots their entries name now)."""
        if not self._in_free_group:
            raise InvalidArgumentError("free_group_end without free_group_begin")
        if self._resolves_at_group_end():
            slots = torch.cat(self._group_slots) if self._group_slots else self._as_index([])
            indices, swa = self._resolve_swa(slots)
            self.full_attn_allocator.free_group_end()
            self._release_swa(indices, swa)
        else:
            self.full_attn_allocator.free_group_end()
            self.swa_attn_allocator.free_group_end()
        self._in_free_group = False
        self._group_slots = []


__all__ = ["SWAFrees"]

"""``SWAFrees``: how the SWA hybrid allocator releases slots (a mixin of
:class:`~kvpool.reference.swa.allocator.SWATokenToKVPoolAllocator`).

``free(full slots)`` releases full slots and the SWA slots their mapping entries name (whole
pages above page size 1) and zeroes those entries; ``free_swa(full slots)`` releases only the
SWA slots (tokens that slid out of the window). Entries equal to 0 (the sentinel) are skipped.
Inside a free group, ``Rules.swa_free_resolve`` says when the entries are read:

- ``"free"`` (kvpool): at the call. Both pools are in the group: the full slots and the SWA
  slots are buffered by their page allocators and the entries are zeroed at once, so the mapping
  of a released full slot is always 0.
- ``"group_end"`` (SGLang 0.5.16): only the full pool is in the group. A ``free`` buffers the
  full slots with their entries intact; ``free_group_end`` frees them (one free of the
  concatenation) and then the SWA slots their entries name at that moment (one free). A
  ``free_swa`` inside the group frees at once.

SGLang 0.5.23's split frees (its SWA tree and its ``free_kv_row_segments`` call them):
``free_full`` / ``free_full_segment`` release full slots whose SWA slots are gone already
(kvpool refuses a slot whose entry still names one: InvalidArgumentError, nothing changed);
``free_swa_segment`` releases the SWA pages of a kv-row segment (page-aligned ``start_pos``),
one per ``page_size`` slots, in order, through the SWA pool's ``free_page_ids`` (a page whose
first slot maps to 0 is skipped: the sentinel is never freed), zeroing the entries of those
pages; ``free_segment`` is ``free_swa_segment`` then the full pool's ``free_segment``.

Every call validates in full before any change (the full allocator's errors, then the SWA
allocator's for a corrupt mapping).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    AlignmentError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
)

if TYPE_CHECKING:
    from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
    from kvpool.rules import Rules


class SWAFrees:
    """``free``, ``free_swa`` and the free group of the SWA allocator (module docstring)."""

    full_attn_allocator: BaseTokenToKVPoolAllocator
    swa_attn_allocator: BaseTokenToKVPoolAllocator
    full_to_swa_index_mapping: list[int]
    page_size: int
    rules: Rules
    _in_free_group: bool
    _group_slots: list[int]

    def _slot_limit(self) -> int:
        raise NotImplementedError

    def _resolves_at_group_end(self) -> bool:
        return self.rules.swa_free_resolve == "group_end"

    def _swa_in_group(self) -> bool:
        """Whether the SWA pool buffers its frees now (only under ``"free"`` resolution)."""
        return self._in_free_group and not self._resolves_at_group_end()

    def _mapping_indices(self, slots: Sequence[int]) -> list[int]:
        """The full slots whose mapping a free of ``slots`` resolves: the slots themselves at
        page size 1, every slot of their pages (each once, in the order the slots name them)
        above; the SWA pool's paged free sorts its pages, so the order shows only in a free
        group's pending slots (SGLang 0.5.23 keeps the call's order there)."""
        ps = self.page_size
        if ps == 1:
            return list(slots)
        pages = list(dict.fromkeys(s // ps for s in slots))
        return [p * ps + i for p in pages for i in range(ps)]

    def _check_full_range(self, slots: Sequence[int]) -> None:
        bad = [s for s in slots if not isinstance(s, int) or not 0 <= s < self._slot_limit()]
        if bad:
            raise IndexOutOfRangeError(f"full slots out of range [0, {self._slot_limit()}): {bad}")

    def _resolve_swa(self, slots: Sequence[int]) -> tuple[list[int], list[int]]:
        """(mapping indices, their SWA slots other than the sentinel), validated against the SWA
        allocator before any change."""
        indices = self._mapping_indices(slots)
        swa = [self.full_to_swa_index_mapping[i] for i in indices]
        swa = [s for s in swa if s != RESERVED_INDEX]  # the sentinel is no slot
        swa_alloc = self.swa_attn_allocator
        swa_alloc._validate_free(swa, swa_alloc._pending_free if self._swa_in_group() else [])
        return indices, swa

    def _release_swa(self, indices: list[int], swa: list[int]) -> None:
        for i in indices:
            self.full_to_swa_index_mapping[i] = RESERVED_INDEX
        self.swa_attn_allocator.free(swa)

    def free(self, free_index: Sequence[int]) -> None:
        """Free full slots (whole pages above page size 1) and the SWA slots their mapping
        names, zeroing those entries; inside a free group as ``Rules.swa_free_resolve`` says
        (module docstring). The full allocator's errors, then the SWA allocator's (a corrupt
        mapping), before any change. Empty input is a no-op."""
        slots = list(free_index)
        if not slots:
            return
        full_alloc = self.full_attn_allocator
        full_alloc._validate_free(slots, full_alloc._pending_free if self._in_free_group else [])
        if self._in_free_group and self._resolves_at_group_end():
            full_alloc.free(slots)  # buffered; the entries are read at free_group_end
            self._group_slots.extend(slots)
            return
        indices, swa = self._resolve_swa(slots)
        full_alloc.free(slots)
        self._release_swa(indices, swa)

    def free_swa(self, free_index: Sequence[int]) -> None:
        """Free only the SWA slots of full slots (tokens that slid out of the window; whole
        pages above page size 1) and zero their entries; the full slots stay allocated. Slots
        mapped to 0 (none) are skipped. IndexOutOfRangeError for a slot outside the full pool;
        the SWA allocator's errors for a corrupt mapping. Empty input is a no-op."""
        slots = list(free_index)
        if not slots:
            return
        self._check_full_range(slots)
        indices, swa = self._resolve_swa(slots)
        self._release_swa(indices, swa)

    def _check_unmapped(self, slots: Sequence[int]) -> None:
        self._check_full_range(slots)
        mapped = [s for s in slots if self.full_to_swa_index_mapping[s] != RESERVED_INDEX]
        if mapped:
            raise InvalidArgumentError(f"full slots still holding an SWA slot: {mapped}")

    def free_full(self, free_index: Sequence[int]) -> None:
        """Free full slots whose SWA slots were released already (SGLang 0.5.23's
        ``free_full``): InvalidArgumentError (nothing changed) for a slot whose mapping entry
        is not 0; the full allocator's errors. Empty input is a no-op."""
        slots = list(free_index)
        if not slots:
            return
        self._check_unmapped(slots)
        self.full_attn_allocator.free(slots)

    def free_full_segment(self, free_index: Sequence[int], start_pos: int = 0) -> None:
        """:meth:`free_full` of a kv-row segment (the full pool's ``free_segment``: its pages
        in order; ``start_pos`` page-aligned, else AlignmentError)."""
        slots = list(free_index)
        if not slots:
            return
        self._check_unmapped(slots)
        self.full_attn_allocator.free_segment(slots, start_pos)

    def _segment_swa_pages(self, slots: list[int], start_pos: int) -> tuple[list[int], list[int]]:
        """(mapping indices, SWA pages) a segment free releases: the first slot of each page
        names its SWA page (0: none, skipped); validated before any change."""
        ps = self.page_size
        if start_pos % ps:
            raise AlignmentError(f"segment start {start_pos} is not page-aligned")
        self._check_full_range(slots)
        firsts = slots[::ps]
        named = [(f, self.full_to_swa_index_mapping[f]) for f in firsts]
        live = [(f, s) for f, s in named if s != RESERVED_INDEX]
        indices = [f // ps * ps + i for f, _ in live for i in range(ps)]
        pages = [s // ps for _, s in live]
        swa_alloc = self.swa_attn_allocator
        swa_alloc._validate_free([p * ps for p in pages], [])
        twice = sorted({p for p in pages if pages.count(p) > 1})
        if twice:
            raise DoubleFreeError("SWA pages named twice in one segment", twice)
        return indices, pages

    def free_swa_segment(self, free_index: Sequence[int], start_pos: int = 0) -> None:
        """Free the SWA pages of a kv-row segment (module docstring), zeroing their entries;
        the full slots stay allocated. Empty input is a no-op."""
        slots = list(free_index)
        if not slots:
            return
        indices, pages = self._segment_swa_pages(slots, start_pos)
        for i in indices:
            self.full_to_swa_index_mapping[i] = RESERVED_INDEX
        self.swa_attn_allocator.free_page_ids(pages)

    def free_segment(self, free_index: Sequence[int], start_pos: int = 0) -> None:
        """Both pools' pages of a kv-row segment: :meth:`free_swa_segment`, then the full
        pool's ``free_segment`` (validated in full first)."""
        slots = list(free_index)
        if not slots:
            return
        self.full_attn_allocator._validate_free(slots, [])
        indices, pages = self._segment_swa_pages(slots, start_pos)
        for i in indices:
            self.full_to_swa_index_mapping[i] = RESERVED_INDEX
        self.swa_attn_allocator.free_page_ids(pages)
        self.full_attn_allocator.free_segment(slots, start_pos)

    def free_group_begin(self) -> None:
        """Open a free group (on both pools, or on the full pool only under ``"group_end"``).
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
        ``"group_end"``: the full slots, then the SWA slots their entries name now).
        InvalidArgumentError without an open group; the full allocator's error (the group
        stays open) when its buffered frees are no longer valid."""
        if not self._in_free_group:
            raise InvalidArgumentError("free_group_end without free_group_begin")
        if self._resolves_at_group_end():
            indices, swa = self._resolve_swa(self._group_slots)
            self.full_attn_allocator.free_group_end()
            self._release_swa(indices, swa)
        else:
            self.full_attn_allocator.free_group_end()
            self.swa_attn_allocator.free_group_end()
        self._in_free_group = False
        self._group_slots = []


__all__ = ["SWAFrees"]

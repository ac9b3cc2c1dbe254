"""Sliding-window (SWA) hybrid allocators: ``SWATokenToKVPoolAllocator`` and the pure-SWA one.

A hybrid model has full-attention layers, whose KV every later token reads, and sliding-window
layers, whose KV only the next ``sliding_window`` tokens read. The KV of the two kinds lives in
two pools of different sizes (tokens): a *full* pool of ``size`` tokens and a smaller *SWA* pool
of ``size_swa`` tokens, each with its own page allocator. A token is named by its full slot (the
request table holds full slots); ``full_to_swa_index_mapping[f]`` names the SWA slot of full slot
``f``, or 0 (the sentinel: no SWA slot; index 0 is reserved in both pools). The mapping has
``size + page_size + 1`` entries; the last is ``-1`` so that translating a ``last_loc`` of -1
(no prefix) gives -1.

Contract (kvpool's, stricter than SGLang where noted):

- every allocation takes slots in both pools, in step (the same page counts), or returns
  ``None`` and changes nothing: both capacities are checked first (SGLang's ``alloc_decode``
  takes full pages before it finds the SWA pool short, and drops them);
- ``free(full slots)`` frees the full slots and, resolved *at the call* (also inside a free
  group), the SWA slots their mapping names, then zeroes those entries: the mapping of a slot
  that is not allocated is always 0, so a recycled full slot never carries a stale SWA slot;
- ``free_swa(full slots)`` frees only the SWA slots (tokens that slid out of the window) and
  zeroes their entries; the full slots stay allocated. The sentinel 0 is never freed;
- ``backup_state`` / ``restore_state`` include the mapping (SGLang restores the free lists only,
  which leaves stale entries for the slots allocated in between).

At page size > 1 both pools page in step: frees act on whole pages of the full pool and on the
SWA pages their slots map to.

Frees. ``free(full slots)`` releases full slots and the SWA slots their mapping entries name
(whole pages above page size 1) and zeroes those entries; ``free_swa(full slots)`` releases only
the SWA slots. Entries equal to 0 (the sentinel) are skipped. Inside a free group,
``Rules.swa_free_resolve`` says when the entries are read:

- ``"free"`` (kvpool): at the call. Both pools are in the group: the full slots and the SWA
  slots are buffered by their page allocators and the entries are zeroed at once, so the mapping
  of a released full slot is always 0.
- ``"group_end"`` (SGLang 0.5.16): the group is this allocator's, neither pool's. A ``free``
  buffers the full slots with their entries intact; ``free_group_end`` frees them (one free of
  the concatenation) and then the SWA slots their entries name at that moment (one free). A
  ``free_swa``, ``free_full`` (0.5.16's tree calls the full pool's ``free`` directly) inside the
  group frees at once. The snapshot shows the buffered slots as the full pool's open group.

SGLang 0.5.23's split frees (its SWA tree and its ``free_kv_row_segments`` call them):
``free_full`` / ``free_full_segment`` release full slots whose SWA slots are gone already
(kvpool refuses a slot whose entry still names one: InvalidArgumentError, nothing changed);
``free_swa_segment`` releases the SWA pages of a kv-row segment (page-aligned ``start_pos``),
one per ``page_size`` slots, in order, through the SWA pool's ``free_page_ids`` (a page whose
first slot maps to 0 is skipped: the sentinel is never freed), zeroing the entries of those
pages; ``free_segment`` is ``free_swa_segment`` then the full pool's ``free_segment``.

Every free validates in full before any change (the full allocator's errors, then the SWA
allocator's for a corrupt mapping).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX
from kvpool.errors import (
    AlignmentError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
)
from kvpool.host_checks import as_count, int_list
from kvpool.reference.pools.allocator import FreeListState
from kvpool.reference.pools.allocator_choice import allocator_for
from kvpool.reference.pools.paged_ops import (
    decode_new_pages,
    extend_new_pages,
    validate_extend_args,
)
from kvpool.rules import Rules
from kvpool.snapshot import SWAAllocatorSnapshot

SWAState = tuple[FreeListState, FreeListState, tuple[int, ...]]
"""What :meth:`SWATokenToKVPoolAllocator.backup_state` returns: (full, SWA, mapping)."""


class SWATokenToKVPoolAllocator:
    """A full pool of ``size`` tokens and an SWA pool of ``size_swa`` tokens, both of
    ``page_size``, joined by ``full_to_swa_index_mapping`` (see the module docstring).

    Raises PageSizeError / ConfigError for a bad page size or sizes that are not positive
    multiples of it. ``rules`` go to both page allocators (kvpool's by default)."""

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        need_sort: bool = False,
        *,
        rules: Rules | None = None,
    ) -> None:
        self.full_attn_allocator = allocator_for(size, page_size, need_sort, rules=rules)
        self.swa_attn_allocator = allocator_for(size_swa, page_size, need_sort, rules=rules)
        self._size_full, self._size_swa = size, size_swa
        self.page_size = page_size
        self.need_sort = bool(need_sort)
        self.full_to_swa_index_mapping: list[int] = [0] * (size + page_size) + [NO_LAST_LOC]
        self.rules = rules if rules is not None else Rules()
        self._in_free_group = False
        self._group_slots: list[int] = []
        self.clear()

    # ----------------------------------------------------------------- sizes
    @property
    def size(self) -> int:
        """Tokens both pools can hold: ``min(size_full, size_swa)``."""
        return min(self._size_full, self._size_swa)

    @property
    def size_full(self) -> int:
        return self._size_full

    @property
    def size_swa(self) -> int:
        return self._size_swa

    def available_size(self) -> int:
        """Tokens allocatable now in both pools: the smaller free count."""
        return min(self.full_available_size(), self.swa_available_size())

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def snapshot(self) -> SWAAllocatorSnapshot:
        """Both pools' snapshots and the mapping (tail included); under ``"group_end"`` an open
        group's buffered slots are the full pool's pending frees."""
        full = self.full_attn_allocator.snapshot()
        if self._in_free_group and self._resolves_at_group_end():
            full = replace(full, in_free_group=True, pending_free=tuple(self._group_slots))
        return SWAAllocatorSnapshot(
            full=full,
            swa=self.swa_attn_allocator.snapshot(),
            full_to_swa=tuple(self.full_to_swa_index_mapping),
            resolves_at_group_end=self._resolves_at_group_end(),
        )

    # ----------------------------------------------------------------- mapping
    def _slot_limit(self) -> int:
        return self._size_full + self.page_size

    def translate_loc_from_full_to_swa(self, kv_indices: Sequence[int]) -> list[int]:
        """SWA slot of each full slot (0 where it has none; -1 stays -1). Raises
        IndexOutOfRangeError for an index outside ``[-1, size + page_size)``."""
        locs = int_list("slots", kv_indices)
        bad = [x for x in locs if not NO_LAST_LOC <= x < self._slot_limit()]
        if bad:
            raise IndexOutOfRangeError(f"full slots out of range: {bad}")
        return [self.full_to_swa_index_mapping[x] for x in locs]

    def set_full_to_swa_mapping(
        self, full_indices: Sequence[int], swa_indices: Sequence[int]
    ) -> None:
        """``mapping[full_indices[i]] = swa_indices[i]`` (0 unmaps): the SWA radix cache moves a
        request's SWA slots onto a tree node's full slots with it. Raises InvalidArgumentError
        for lists of different lengths, IndexOutOfRangeError for a slot outside its pool."""
        full, swa = int_list("full slots", full_indices), int_list("SWA slots", swa_indices)
        if len(full) != len(swa):
            raise InvalidArgumentError(f"{len(full)} full slots but {len(swa)} SWA slots")
        self._check_full_range(full)
        swa_limit = self._size_swa + self.page_size
        bad = [s for s in swa if not 0 <= s < swa_limit]
        if bad:
            raise IndexOutOfRangeError(f"SWA slots out of range [0, {swa_limit}): {bad}")
        self._set_mapping(full, swa)

    # ----------------------------------------------------------------- alloc
    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` full slots, each mapped to a new SWA slot; ``None`` (no change) unless
        both pools have room. Page size 1 only (InvalidArgumentError above, as SGLang asserts);
        InvalidArgumentError for a negative size."""
        if self.page_size != 1:
            raise InvalidArgumentError("SWA alloc needs page_size 1; use alloc_extend")
        self.full_attn_allocator._check_need_size(need_size)
        if need_size > self.available_size():
            return None
        full = self.full_attn_allocator.alloc(need_size)
        swa = self.swa_attn_allocator.alloc(need_size)
        assert full is not None and swa is not None
        self._set_mapping(full, swa)
        return full

    def _set_mapping(self, full: Sequence[int], swa: Sequence[int]) -> None:
        for f, s in zip(full, swa, strict=True):
            self.full_to_swa_index_mapping[f] = s

    def _check_batch(
        self, prefix: list[int], seq: list[int], last_loc: Sequence[int], n: int
    ) -> tuple[list[int], list[int]]:
        """Both sides' checks of an extend (full ``last_loc`` and its SWA translation), before
        any change; returns (full last_loc, SWA last_loc)."""
        full_alloc, swa_alloc = self.full_attn_allocator, self.swa_attn_allocator
        locs = int_list("last_loc", last_loc)
        validate_extend_args(prefix, seq, locs, n, self.page_size)
        full_alloc._check_prefix_pages_held(prefix, locs)
        swa_locs = self.translate_loc_from_full_to_swa(locs)
        validate_extend_args(prefix, seq, swa_locs, n, self.page_size)
        swa_alloc._check_prefix_pages_held(prefix, swa_locs)
        return locs, swa_locs

    def _pages_fit(self, full_pages: int, swa_pages: int) -> bool:
        ps = self.page_size
        return full_pages * ps <= self.full_available_size() and (
            swa_pages * ps <= self.swa_available_size()
        )

    def alloc_extend(
        self,
        prefix_lens: Sequence[int],
        prefix_lens_cpu: Sequence[int],
        seq_lens: Sequence[int],
        seq_lens_cpu: Sequence[int],
        last_loc: Sequence[int],
        extend_num_tokens: int,
    ) -> list[int] | None:
        """Full slots for tokens ``[P_i, S_i)`` of every request (as the paged allocator gives
        them), each mapped to an SWA slot taken the same way from the SWA pool with the
        translated ``last_loc``; ``None`` (no change) unless both pools fit the new pages. Page
        size > 1 (InvalidArgumentError at 1, as SGLang asserts). The paged allocator's errors,
        for either side (a prefix's last token must still hold its SWA slot)."""
        if self.page_size == 1:
            raise InvalidArgumentError("SWA alloc_extend needs page_size > 1; use alloc")
        full_alloc = self.full_attn_allocator
        prefix, _ = full_alloc._check_batch("prefix_lens", prefix_lens, prefix_lens_cpu)
        seq, _ = full_alloc._check_batch("seq_lens", seq_lens, seq_lens_cpu)
        locs, swa_locs = self._check_batch(prefix, seq, last_loc, extend_num_tokens)
        ps = self.page_size
        pages = sum(extend_new_pages(p, s, ps) for p, s in zip(prefix, seq, strict=True))
        if not self._pages_fit(pages, pages):
            return None
        full = full_alloc.alloc_extend(prefix, prefix, seq, seq, locs, extend_num_tokens)
        swa = self.swa_attn_allocator.alloc_extend(
            prefix, prefix, seq, seq, swa_locs, extend_num_tokens
        )
        assert full is not None and swa is not None
        self._set_mapping(full, swa)
        return full

    def alloc_extend_swa_tail(
        self,
        prefix_lens: Sequence[int],
        prefix_lens_cpu: Sequence[int],
        seq_lens: Sequence[int],
        seq_lens_cpu: Sequence[int],
        last_loc: Sequence[int],
        extend_num_tokens: int,
        swa_tail_len: int,
    ) -> list[int] | None:
        """One request (batch of 1): full slots for the whole extend, SWA slots (from fresh
        pages) only for its last ``swa_tail_len`` tokens; the other new full slots map to 0.
        ``None`` (no change) unless both pools fit. InvalidArgumentError for page size 1, a
        batch of another size or ``swa_tail_len`` outside ``[0, extend_num_tokens]``;
        AlignmentError for a tail that starts mid-page (kvpool: SGLang's caller, disaggregated
        decode, starts it at a page boundary, which keeps the two pools' pages paired)."""
        if self.page_size == 1:
            raise InvalidArgumentError("SWA alloc_extend_swa_tail needs page_size > 1")
        full_alloc = self.full_attn_allocator
        prefix, _ = full_alloc._check_batch("prefix_lens", prefix_lens, prefix_lens_cpu)
        seq, _ = full_alloc._check_batch("seq_lens", seq_lens, seq_lens_cpu)
        if len(prefix) != 1 or len(seq) != 1:
            raise InvalidArgumentError("alloc_extend_swa_tail takes a batch of one request")
        extend_num_tokens = as_count("extend_num_tokens", extend_num_tokens)
        swa_tail_len = as_count("swa_tail_len", swa_tail_len)
        if not 0 <= swa_tail_len <= extend_num_tokens:
            raise InvalidArgumentError(
                f"swa_tail_len must be in [0, {extend_num_tokens}], got {swa_tail_len!r}"
            )
        if swa_tail_len and (seq[0] - swa_tail_len) % self.page_size:
            # the tail must start on a page boundary so that its SWA pages pair with full pages
            raise AlignmentError(f"the SWA tail of {swa_tail_len} tokens starts mid-page")
        locs = int_list("last_loc", last_loc)
        validate_extend_args(prefix, seq, locs, extend_num_tokens, self.page_size)
        full_alloc._check_prefix_pages_held(prefix, locs)
        ps = self.page_size
        full_pages = extend_new_pages(prefix[0], seq[0], ps)
        if not self._pages_fit(full_pages, extend_new_pages(0, swa_tail_len, ps)):
            return None
        full = full_alloc.alloc_extend(prefix, prefix, seq, seq, locs, extend_num_tokens)
        assert full is not None
        head = len(full) - swa_tail_len
        if swa_tail_len:
            tail = [swa_tail_len]
            swa = self.swa_attn_allocator.alloc_extend([0], [0], tail, tail, [NO_LAST_LOC], tail[0])
            assert swa is not None
            self._set_mapping(full[head:], swa)
        self._set_mapping(full[:head], [RESERVED_INDEX] * head)
        return full

    def alloc_decode(
        self, seq_lens: Sequence[int], seq_lens_cpu: Sequence[int], last_loc: Sequence[int]
    ) -> list[int] | None:
        """One full slot per request for token ``S_i - 1``, mapped to an SWA slot decoded the
        same way from the translated ``last_loc``; ``None`` (no change) unless both pools fit
        the new pages. Page size > 1 (InvalidArgumentError at 1); the paged allocator's
        errors for either side."""
        if self.page_size == 1:
            raise InvalidArgumentError("SWA alloc_decode needs page_size > 1; use alloc")
        full_alloc = self.full_attn_allocator
        seq, _ = full_alloc._check_batch("seq_lens", seq_lens, seq_lens_cpu)
        if any(s < 1 for s in seq):
            raise InvalidArgumentError(f"alloc_decode needs every seq_len >= 1, got {seq}")
        locs, swa_locs = self._check_batch([s - 1 for s in seq], seq, last_loc, len(seq))
        pages = decode_new_pages(seq, self.page_size)
        if not self._pages_fit(pages, pages):
            return None
        full = full_alloc.alloc_decode(seq, seq, locs)
        swa = self.swa_attn_allocator.alloc_decode(seq, seq, swa_locs)
        assert full is not None and swa is not None
        self._set_mapping(full, swa)
        return full

    # ----------------------------------------------------------------- free
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

    def _check_full_held(self, slots: Sequence[int]) -> None:
        """Full slots the caller holds (slot 0, padding, is skipped): InvalidArgumentError for a
        slot on a free page of the full pool (freeing its SWA slot would act on a slot the
        caller gave back already)."""
        ps = self.page_size
        free = self.full_attn_allocator._free_set
        loose = sorted({s for s in slots if s != RESERVED_INDEX and s // ps in free})
        if loose:
            raise InvalidArgumentError(f"full slots not allocated: {loose}")

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
        mapping), before any change. Empty input is a no-op. InvalidArgumentError unless
        ``free_index`` is a sequence of integers."""
        slots = int_list("free_index", free_index)
        if not slots:
            return
        full_alloc = self.full_attn_allocator
        if self._in_free_group and self._resolves_at_group_end():
            # buffered here, the pools untouched; the entries are read at free_group_end
            full_alloc._validate_free(slots, self._group_slots)
            self._group_slots.extend(slots)
            return
        full_alloc._validate_free(slots, full_alloc._pending_free if self._in_free_group else [])
        indices, swa = self._resolve_swa(slots)
        full_alloc.free(slots)
        self._release_swa(indices, swa)

    def free_swa(self, free_index: Sequence[int]) -> None:
        """Free only the SWA slots of full slots (tokens that slid out of the window; whole
        pages above page size 1) and zero their entries; the full slots stay allocated. Slots
        mapped to 0 (none) are skipped. InvalidArgumentError for non-integers;
        IndexOutOfRangeError for a slot outside the full pool; InvalidArgumentError for a slot
        whose full page is free (slot 0, padding, is skipped); the SWA allocator's errors for a
        corrupt mapping. Empty input is a no-op."""
        slots = int_list("free_index", free_index)
        if not slots:
            return
        self._check_full_range(slots)
        self._check_full_held(slots)
        indices, swa = self._resolve_swa(slots)
        self._release_swa(indices, swa)

    def _check_unmapped(self, slots: Sequence[int]) -> None:
        self._check_full_range(slots)
        mapped = [s for s in slots if self.full_to_swa_index_mapping[s] != RESERVED_INDEX]
        if mapped:
            raise InvalidArgumentError(f"full slots still holding an SWA slot: {mapped}")

    def free_full(self, free_index: Sequence[int]) -> None:
        """Free full slots whose SWA slots were released already (SGLang 0.5.23's
        ``free_full``; 0.5.16's tree calls the full pool's ``free``, so inside a
        ``"group_end"`` group it frees at once): InvalidArgumentError (nothing changed) for a
        slot whose mapping entry is not 0; the full allocator's errors (DoubleFreeError for a
        slot the group buffers). Empty input is a no-op."""
        slots = int_list("free_index", free_index)
        if not slots:
            return
        self._check_unmapped(slots)
        if self._in_free_group and self._resolves_at_group_end():
            ps = self.page_size  # no page the group buffers (its end would free it again)
            twice = sorted({s // ps for s in slots} & {s // ps for s in self._group_slots})
            if twice:
                raise DoubleFreeError("full pages the open free group holds", twice)
        self.full_attn_allocator.free(slots)

    def free_full_segment(self, free_index: Sequence[int], start_pos: int = 0) -> None:
        """:meth:`free_full` of a kv-row segment (the full pool's ``free_segment``: its pages
        in order; ``start_pos`` page-aligned, else AlignmentError; a count, else
        InvalidArgumentError)."""
        slots = int_list("free_index", free_index)
        start_pos = as_count("start_pos", start_pos)
        if not slots:
            return
        if start_pos % self.page_size:
            raise AlignmentError(f"segment start {start_pos} is not page-aligned")
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
        the full slots stay allocated. Empty input is a no-op. InvalidArgumentError for
        non-integers, a ``start_pos`` that is no count or a slot whose full page is free."""
        slots = int_list("free_index", free_index)
        start_pos = as_count("start_pos", start_pos)
        if not slots:
            return
        self._check_full_range(slots)
        self._check_full_held(slots)
        indices, pages = self._segment_swa_pages(slots, start_pos)
        for i in indices:
            self.full_to_swa_index_mapping[i] = RESERVED_INDEX
        self.swa_attn_allocator.free_page_ids(pages)

    def free_segment(self, free_index: Sequence[int], start_pos: int = 0) -> None:
        """Both pools' pages of a kv-row segment: :meth:`free_swa_segment`, then the full
        pool's ``free_segment`` (validated in full first)."""
        slots = int_list("free_index", free_index)
        start_pos = as_count("start_pos", start_pos)
        if not slots:
            return
        self.full_attn_allocator._validate_free(slots, [])
        indices, pages = self._segment_swa_pages(slots, start_pos)
        for i in indices:
            self.full_to_swa_index_mapping[i] = RESERVED_INDEX
        self.swa_attn_allocator.free_page_ids(pages)
        self.full_attn_allocator.free_segment(slots, start_pos)

    def free_group_begin(self) -> None:
        """Open a free group (on both pools; under ``"group_end"`` on this allocator alone).
        InvalidArgumentError when one is open."""
        if self._in_free_group:
            raise InvalidArgumentError("free_group_begin inside an open free group")
        if not self._resolves_at_group_end():
            self.full_attn_allocator.free_group_begin()
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
            slots = self._group_slots
            if slots:  # one free of the concatenation; each side validates before any change
                indices, swa = self._resolve_swa(slots)
                self.full_attn_allocator.free(slots)
                self._release_swa(indices, swa)
        else:
            self.full_attn_allocator.free_group_end()
            self.swa_attn_allocator.free_group_end()
        self._in_free_group = False
        self._group_slots = []

    # ----------------------------------------------------------------- state
    def backup_state(self) -> SWAState:
        """Both pools' free lists and the mapping. InvalidArgumentError inside an open free group
        (kvpool): the group's SWA slots are already unmapped but not yet free, so a restore to
        that state would leak them."""
        if self._in_free_group:
            raise InvalidArgumentError("backup_state inside an open free group")
        return (
            self.full_attn_allocator.backup_state(),
            self.swa_attn_allocator.backup_state(),
            tuple(self.full_to_swa_index_mapping),
        )

    def restore_state(self, state: object) -> None:
        """Put back a :meth:`backup_state`. InvalidArgumentError for anything else (checked
        in full before any change)."""
        if not isinstance(state, tuple) or len(state) != 3:
            raise InvalidArgumentError("state must be the (full, swa, mapping) tuple")
        mapping = list(state[2])
        if len(mapping) != len(self.full_to_swa_index_mapping) or mapping[-1] != NO_LAST_LOC:
            raise InvalidArgumentError("state holds a mapping of the wrong shape")
        probe = allocator_for(self._size_full, self.page_size, False)
        probe.restore_state(state[0])
        probe = allocator_for(self._size_swa, self.page_size, False)
        probe.restore_state(state[1])
        self.full_attn_allocator.restore_state(state[0])
        self.swa_attn_allocator.restore_state(state[1])
        self.full_to_swa_index_mapping[:] = mapping  # in place: an SWAKVPool shares the list

    def merge_and_sort_free(self) -> None:
        """Merge and sort both pools' release pages into their free pages."""
        self.full_attn_allocator.merge_and_sort_free()
        self.swa_attn_allocator.merge_and_sort_free()

    def clear(self) -> None:
        """Both pools empty, every entry 0 but the -1 tail, no open free group."""
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        limit = self._slot_limit()
        self.full_to_swa_index_mapping[:limit] = [RESERVED_INDEX] * limit
        self._in_free_group = False
        self._group_slots = []


__all__ = ["SWAState", "SWATokenToKVPoolAllocator"]

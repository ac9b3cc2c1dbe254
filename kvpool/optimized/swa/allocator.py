"""Sliding-window (SWA) hybrid allocators (optimized twin): ``SWATokenToKVPoolAllocator`` and
the pure-SWA one.

Twin of :mod:`kvpool.reference.swa.allocator` (same methods, results and errors; read its module
docstring for the contract). ``full_to_swa_index_mapping`` is an int64 tensor of
``size + page_size + 1`` entries on ``device`` (the last is -1). Allocations and the mapping
updates are tensor work; capacity is compared on host metadata (free-list lengths). A free reads
the mapping and drops the sentinel entries with a mask, whose data-dependent size waits for the
device (SGLang's free does the same); at page size > 1 the freed pages are expanded to their
slots once each, in ascending order, as the reference does. ``checked`` validates every
call as the reference does, before any change. SGLang 0.5.23's split frees (``free_full``,
``free_full_segment``, ``free_swa_segment``, ``free_segment``) read the first slot of each page
and free pages in the given order, as the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX
from kvpool.errors import (
    AlignmentError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
)
from kvpool.host_checks import as_count
from kvpool.kernels.host import HostLens
from kvpool.optimized.host_view import host_array, store_at
from kvpool.optimized.index_args import any_outside, index_tensor
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.optimized.pools.allocator import FreeListState
from kvpool.optimized.pools.allocator_choice import allocator_for
from kvpool.optimized.pools.free_list import cat_index_parts
from kvpool.optimized.pools.paged_ops import (
    check_decode_host,
    check_extend_args,
    check_extend_host,
    check_free_slots,
    check_host_copy,
    check_integer_tensors,
    check_prefix_pages_held,
    check_slot_range,
    decode_new_pages_host,
    extend_new_pages_host,
)
from kvpool.optimized.swa.mapping_ops import (
    check_full_held,
    check_swa_state,
    slots_of_named_pages,
)
from kvpool.rules import Rules
from kvpool.snapshot import SWAAllocatorSnapshot

IndexLike = torch.Tensor | Sequence[int]
SWAState = tuple[FreeListState, FreeListState, torch.Tensor]
"""What :meth:`SWATokenToKVPoolAllocator.backup_state` returns: (full, SWA, mapping clone)."""


class SWATokenToKVPoolAllocator:
    """A full pool of ``size`` tokens and an SWA pool of ``size_swa`` tokens joined by
    ``full_to_swa_index_mapping`` (twin of the reference class)."""

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        need_sort: bool = False,
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
    ) -> None:
        self.options = twin_options(options)
        self.checked = self.options.checked
        opts = self.options
        self.full_attn_allocator = allocator_for(
            size, page_size, need_sort, rules=rules, options=opts
        )
        self.swa_attn_allocator = allocator_for(
            size_swa, page_size, need_sort, rules=rules, options=opts
        )
        self._size_full, self._size_swa = size, size_swa
        self.page_size = page_size
        self.need_sort = bool(need_sort)
        self.device = self.options.device
        self.full_to_swa_index_mapping = torch.zeros(
            size + page_size + 1, dtype=torch.int64, device=self.device
        )
        self.full_to_swa_index_mapping[-1] = NO_LAST_LOC
        self._offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        self.rules = rules if rules is not None else Rules()
        self._in_free_group = False
        self._group_slots: list[torch.Tensor] = []
        # checked, page size 1, "group_end": the slots the group buffers (the full pool's own
        # pending mask is for its own group, which this rule leaves closed)
        pending = self.full_attn_allocator._pending_mask
        self._group_mask = None if pending is None else torch.zeros_like(pending)
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
        """Both pools' snapshots and the mapping (device-to-host copies); under
        ``"group_end"`` an open group's buffered slots are the full pool's pending frees."""
        full = self.full_attn_allocator.snapshot()
        if self._in_free_group and self._resolves_at_group_end():
            pending = cat_index_parts(self._group_slots) if self._group_slots else None
            slots = () if pending is None else tuple(host_array(pending).tolist())
            full = replace(full, in_free_group=True, pending_free=slots)
        return SWAAllocatorSnapshot(
            full=full,
            swa=self.swa_attn_allocator.snapshot(),
            full_to_swa=tuple(host_array(self.full_to_swa_index_mapping).tolist()),
            resolves_at_group_end=self._resolves_at_group_end(),
        )

    # ----------------------------------------------------------------- mapping
    def _as_index(self, values: IndexLike, name: str = "slots") -> torch.Tensor:
        """``values`` as 1-D int64 on the device: InvalidArgumentError naming ``name`` unless
        it is a 1-D integer index argument (metadata and host values: both modes, as the
        reference's ``int_list``)."""
        return index_tensor(name, values, self.device)

    def _host_range(self, given: object, slots: torch.Tensor, low: int) -> None:
        """Unchecked mode, slots a caller gave as host values (not a tensor): the range check
        reads no device data for them, so it runs (checked mode runs it anyway)."""
        if not self.checked and not isinstance(given, torch.Tensor):
            self._check_range(slots, low)

    def _host_free_range(self, given: object, slots: torch.Tensor) -> None:
        """:meth:`_host_range` of a free of full slots: the full pool's range and reserved
        page checks, as the reference's."""
        if not self.checked and not isinstance(given, torch.Tensor):
            check_slot_range(slots, self._size_full // self.page_size, self.page_size)

    def _check_full_held(self, slots: torch.Tensor) -> None:
        """Checked mode (a device read): full slots the caller holds, as the reference
        (:func:`~kvpool.optimized.swa.mapping_ops.check_full_held`: slot 0 skipped)."""
        check_full_held(slots, self.full_attn_allocator._free_mask, self.page_size)

    def _check_range(self, slots: torch.Tensor, low: int) -> None:
        limit = self._size_full + self.page_size
        if not any_outside(slots, low, limit):
            return
        bad = (slots < low) | (slots >= limit)
        if bool(bad.any()):
            raise IndexOutOfRangeError(f"full slots out of range: {slots[bad].tolist()}")

    def translate_loc_from_full_to_swa(self, kv_indices: IndexLike) -> torch.Tensor:
        """SWA slot of each full slot (0 where it has none; -1 stays -1: it indexes the tail).
        Checked mode: IndexOutOfRangeError outside ``[-1, size + page_size)``."""
        locs = self._as_index(kv_indices)
        self._host_range(kv_indices, locs, NO_LAST_LOC)
        if self.checked:
            self._check_range(locs, NO_LAST_LOC)
        return self._mapped(locs)

    def _mapped(self, locs: torch.Tensor) -> torch.Tensor:
        """``full_to_swa_index_mapping[locs]`` (a new int64 tensor) for range-checked ``locs``:
        checked mode on the CPU gathers through NumPy views (it reads the host anyway; -1 reads
        the tail entry in both), else the indexed read itself."""
        mapping = self.full_to_swa_index_mapping
        if self.checked and locs.is_cpu and mapping.is_cpu:
            return torch.from_numpy(mapping.numpy()[locs.numpy()])
        return mapping[locs]

    def _map(self, full: torch.Tensor, swa: torch.Tensor) -> None:
        """``full_to_swa_index_mapping[full] = swa`` for new full slots and their SWA slots
        (both int64, from the inner allocators): through NumPy views in checked mode on the
        CPU, else the indexed store itself."""
        if self.checked:
            store_at(self.full_to_swa_index_mapping, full, swa)
        else:
            self.full_to_swa_index_mapping[full] = swa

    def set_full_to_swa_mapping(self, full_indices: IndexLike, swa_indices: IndexLike) -> None:
        """``mapping[full_indices[i]] = swa_indices[i]`` (0 unmaps). Checked mode:
        InvalidArgumentError for different lengths, IndexOutOfRangeError out of range."""
        full, swa = self._as_index(full_indices), self._as_index(swa_indices)
        if full.numel() != swa.numel():  # metadata: checked in both modes
            raise InvalidArgumentError(f"{full.numel()} full slots but {swa.numel()} SWA slots")
        # value checks: in checked mode, or on host values (no device read for them)
        if self.checked or not isinstance(full_indices, torch.Tensor):
            self._check_range(full, 0)
        if self.checked or not isinstance(swa_indices, torch.Tensor):
            swa_limit = self._size_swa + self.page_size
            bad = (swa < 0) | (swa >= swa_limit)
            if bool(bad.any()):
                raise IndexOutOfRangeError(f"SWA slots out of range: {swa[bad].tolist()}")
        self.full_to_swa_index_mapping[full] = swa

    # ----------------------------------------------------------------- alloc
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` full slots mapped to new SWA slots; ``None`` (no change) unless both
        pools have room. Page size 1 only (InvalidArgumentError above)."""
        if self.page_size != 1:
            raise InvalidArgumentError("SWA alloc needs page_size 1; use alloc_extend")
        self.full_attn_allocator._check_need_size(need_size)
        if need_size > self.available_size():
            return None
        full = self.full_attn_allocator.alloc(need_size)
        swa = self.swa_attn_allocator.alloc(need_size)
        assert full is not None and swa is not None
        self._map(full, swa)
        return full

    def _check_batch(
        self,
        prefix: torch.Tensor,
        seq: torch.Tensor,
        last_loc: torch.Tensor,
        n: int,
    ) -> torch.Tensor:
        """The translated ``last_loc``; checked mode first runs both sides' extend checks.
        Unchecked, the caller has run the host checks (the translation indexes a tensor)."""
        if not self.checked:
            return self.full_to_swa_index_mapping[last_loc]
        full_mask = self.full_attn_allocator._free_mask
        swa_mask = self.swa_attn_allocator._free_mask
        assert full_mask is not None and swa_mask is not None
        check_extend_args(prefix, seq, last_loc, n, self.page_size)
        check_prefix_pages_held(prefix, last_loc, full_mask, self.page_size)
        swa_loc = self.translate_loc_from_full_to_swa(last_loc)
        check_extend_args(prefix, seq, swa_loc, n, self.page_size)
        check_prefix_pages_held(prefix, swa_loc, swa_mask, self.page_size)
        return swa_loc

    def _pages_fit(self, full_pages: int, swa_pages: int) -> bool:
        ps = self.page_size
        return full_pages * ps <= self.full_available_size() and (
            swa_pages * ps <= self.swa_available_size()
        )

    def _host_checked(
        self, name: str, device_lens: torch.Tensor, host_lens: HostLens, given: object = None
    ) -> torch.Tensor:
        """``device_lens`` compared with its host copy in checked mode, or when the caller
        gave it as host values (``given`` not a tensor: no device read then)."""
        if self.checked or (given is not None and not isinstance(given, torch.Tensor)):
            return check_host_copy(name, device_lens, host_lens)
        return device_lens

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: HostLens,
        seq_lens: torch.Tensor,
        seq_lens_cpu: HostLens,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Full slots for tokens ``[P_i, S_i)`` mapped to SWA slots extended the same way from
        the translated ``last_loc``; ``None`` (no change) unless both pools fit. Page size > 1."""
        if self.page_size == 1:
            raise InvalidArgumentError("SWA alloc_extend needs page_size > 1; use alloc")
        prefix, seq = self._as_index(prefix_lens), self._as_index(seq_lens)
        loc = self._as_index(last_loc)
        check_integer_tensors(prefix_lens=prefix, seq_lens=seq, last_loc=loc)
        if not self.checked:  # host values only: no device read
            prefix = self._host_checked("prefix_lens", prefix, prefix_lens_cpu, prefix_lens)
            seq = self._host_checked("seq_lens", seq, seq_lens_cpu, seq_lens)
            self._host_range(last_loc, loc, NO_LAST_LOC)
        if self.checked:  # device reads first: the reference's order of checks
            prefix = check_host_copy("prefix_lens", prefix, prefix_lens_cpu)
            seq = check_host_copy("seq_lens", seq, seq_lens_cpu)
            swa_loc = self._check_batch(prefix, seq, loc, extend_num_tokens)
        host = check_extend_host(prefix, prefix_lens_cpu, seq, seq_lens_cpu, loc, extend_num_tokens)
        if not self.checked:
            swa_loc = self._check_batch(prefix, seq, loc, extend_num_tokens)
        pages = extend_new_pages_host(*host, self.page_size)
        if not self._pages_fit(pages, pages):
            return None
        args = (prefix, prefix_lens_cpu, seq, seq_lens_cpu)
        full = self.full_attn_allocator.alloc_extend(*args, loc, extend_num_tokens)
        swa = self.swa_attn_allocator.alloc_extend(*args, swa_loc, extend_num_tokens)
        assert full is not None and swa is not None
        self._map(full, swa)
        return full

    def alloc_extend_swa_tail(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: HostLens,
        seq_lens: torch.Tensor,
        seq_lens_cpu: HostLens,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        swa_tail_len: int,
    ) -> torch.Tensor | None:
        """One request: full slots for the whole extend, SWA slots from fresh pages for its
        last ``swa_tail_len`` tokens only (the others map to 0); ``None`` (no change) unless
        both pools fit. Page size > 1, a batch of one."""
        if self.page_size == 1:
            raise InvalidArgumentError("SWA alloc_extend_swa_tail needs page_size > 1")
        prefix = self._host_checked(
            "prefix_lens", self._as_index(prefix_lens), prefix_lens_cpu, prefix_lens
        )
        seq = self._host_checked("seq_lens", self._as_index(seq_lens), seq_lens_cpu, seq_lens)
        loc = self._as_index(last_loc)
        self._host_range(last_loc, loc, NO_LAST_LOC)
        check_extend_host(prefix, prefix_lens_cpu, seq, seq_lens_cpu, loc, extend_num_tokens)
        if len(prefix_lens_cpu) != 1 or len(seq_lens_cpu) != 1:
            raise InvalidArgumentError("alloc_extend_swa_tail takes a batch of one request")
        extend_num_tokens = as_count("extend_num_tokens", extend_num_tokens)
        swa_tail_len = as_count("swa_tail_len", swa_tail_len)
        if not 0 <= swa_tail_len <= extend_num_tokens:
            raise InvalidArgumentError(
                f"swa_tail_len must be in [0, {extend_num_tokens}], got {swa_tail_len!r}"
            )
        if swa_tail_len and (int(seq_lens_cpu[0]) - swa_tail_len) % self.page_size:
            # the tail must start on a page boundary so that its SWA pages pair with full pages
            raise AlignmentError(f"the SWA tail of {swa_tail_len} tokens starts mid-page")
        loc = self._as_index(last_loc)
        full_alloc = self.full_attn_allocator
        if full_alloc._free_mask is not None:
            check_extend_args(prefix, seq, loc, extend_num_tokens, self.page_size)
            check_prefix_pages_held(prefix, loc, full_alloc._free_mask, self.page_size)
        full_pages = extend_new_pages_host(prefix_lens_cpu, seq_lens_cpu, self.page_size)
        swa_pages = extend_new_pages_host([0], [swa_tail_len], self.page_size)
        if not self._pages_fit(full_pages, swa_pages):
            return None
        args = (prefix, prefix_lens_cpu, seq, seq_lens_cpu, loc, extend_num_tokens)
        full = full_alloc.alloc_extend(*args)
        assert full is not None
        head = full.numel() - swa_tail_len
        if swa_tail_len:
            zero, tail = self._as_index([0]), self._as_index([swa_tail_len])
            no_loc = self._as_index([NO_LAST_LOC])
            swa = self.swa_attn_allocator.alloc_extend(
                zero, [0], tail, [swa_tail_len], no_loc, swa_tail_len
            )
            assert swa is not None
            self.full_to_swa_index_mapping[full[head:]] = swa
        self.full_to_swa_index_mapping.index_fill_(0, full[:head], RESERVED_INDEX)
        return full

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: HostLens, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """One full slot per request for token ``S_i - 1`` mapped to an SWA slot decoded from
        the translated ``last_loc``; ``None`` (no change) unless both pools fit. Page size > 1."""
        if self.page_size == 1:
            raise InvalidArgumentError("SWA alloc_decode needs page_size > 1; use alloc")
        seq, loc = self._as_index(seq_lens), self._as_index(last_loc)
        check_integer_tensors(seq_lens=seq, last_loc=loc)
        if not self.checked:  # host values only: no device read
            seq = self._host_checked("seq_lens", seq, seq_lens_cpu, seq_lens)
            self._host_range(last_loc, loc, NO_LAST_LOC)
        if self.checked:  # device reads first: the reference's order of checks
            seq = check_host_copy("seq_lens", seq, seq_lens_cpu)
            if any_outside(seq, 1, 1 << 63):  # some S < 1 (int64 holds no S >= 2**63)
                raise InvalidArgumentError(f"alloc_decode needs every seq_len >= 1: {seq.tolist()}")
            swa_loc = self._check_batch(seq - 1, seq, loc, seq.numel())
        host_s = check_decode_host(seq, seq_lens_cpu, loc)
        if not self.checked:
            swa_loc = self._check_batch(seq - 1, seq, loc, seq.numel())
        pages = decode_new_pages_host(host_s, self.page_size)
        if not self._pages_fit(pages, pages):
            return None
        full = self.full_attn_allocator.alloc_decode(seq, seq_lens_cpu, loc)
        swa = self.swa_attn_allocator.alloc_decode(seq, seq_lens_cpu, swa_loc)
        assert full is not None and swa is not None
        self._map(full, swa)
        return full

    # ----------------------------------------------------------------- free
    def _resolves_at_group_end(self) -> bool:
        return self.rules.swa_free_resolve == "group_end"

    def _mapping_indices(self, slots: torch.Tensor) -> torch.Tensor:
        """The full slots a free of ``slots`` resolves: every slot of their pages above page
        size 1, each page once, in the order the slots first name them, as the reference
        (:func:`~kvpool.optimized.swa.mapping_ops.slots_of_named_pages`)."""
        if self.page_size == 1:
            return slots
        return slots_of_named_pages(slots, self.page_size, self._offsets, self.checked)

    def _resolve_swa(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mapping indices, their SWA slots other than the sentinel); checked mode validates
        the SWA slots against the SWA allocator."""
        indices = self._mapping_indices(slots)
        swa = self._mapped(indices)
        swa = swa[swa != RESERVED_INDEX]  # the sentinel is no slot
        inner = self.swa_attn_allocator
        if inner._free_mask is not None and swa.numel():
            check_free_slots(
                swa, inner._free_mask, self.page_size, not inner._dedup_pages, inner._pending_mask
            )
        return indices, swa

    def _release_swa(self, indices: torch.Tensor, swa: torch.Tensor) -> None:
        mapping = self.full_to_swa_index_mapping
        if self.checked:  # as :meth:`_map`
            store_at(mapping, indices, RESERVED_INDEX)
        else:
            mapping.index_fill_(0, indices, RESERVED_INDEX)
        self.swa_attn_allocator.free(swa)

    def free(self, free_index: IndexLike) -> None:
        """Free full slots and the SWA slots their mapping names, zeroing those entries; inside
        a free group as ``Rules.swa_free_resolve`` says. Checked mode validates both sides
        first."""
        slots = self._as_index(free_index, "free_index")
        if slots.numel() == 0:
            return
        self._host_free_range(free_index, slots)
        full_alloc = self.full_attn_allocator
        here = self._in_free_group and self._resolves_at_group_end()
        if full_alloc._free_mask is not None:
            check_free_slots(
                slots,
                full_alloc._free_mask,
                self.page_size,
                not full_alloc._dedup_pages,
                self._group_mask if here else full_alloc._pending_mask,
            )
        if here:  # buffered here, the pools untouched; the entries are read at free_group_end
            self._group_slots.append(slots)
            if self._group_mask is not None:
                self._group_mask[slots] = True
            return
        indices, swa = self._resolve_swa(slots)
        full_alloc.free(slots)
        self._release_swa(indices, swa)

    def free_swa(self, free_index: IndexLike) -> None:
        """Free only the SWA slots of full slots (tokens that slid out of the window), zeroing
        their entries; slots mapped to 0 are skipped. Checked mode: IndexOutOfRangeError for a
        slot outside the full pool, InvalidArgumentError for a slot whose full page is free,
        the SWA allocator's errors for a corrupt mapping."""
        slots = self._as_index(free_index, "free_index")
        if slots.numel() == 0:
            return
        self._host_range(free_index, slots, 0)
        if self.checked:
            self._check_range(slots, 0)
            self._check_full_held(slots)
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
        slots = self._as_index(free_index, "free_index")
        if slots.numel() == 0:
            return
        self._host_free_range(free_index, slots)
        self._check_unmapped(slots)
        full_alloc = self.full_attn_allocator
        if self.checked and self._in_free_group and self._resolves_at_group_end():
            ps = self.page_size  # no page the group buffers (its end would free it again)
            if self._group_slots:
                held = torch.div(cat_index_parts(self._group_slots), ps, rounding_mode="floor")
                ours = torch.div(slots, ps, rounding_mode="floor")
                twice = torch.unique(ours[torch.isin(ours, held)])
                if twice.numel():
                    raise DoubleFreeError("full pages the open free group holds", twice.tolist())
        full_alloc.free(slots)

    def free_full_segment(self, free_index: IndexLike, start_pos: int = 0) -> None:
        """:meth:`free_full` of a kv-row segment (the full pool's ``free_segment``;
        ``start_pos`` a page-aligned count)."""
        slots = self._as_index(free_index, "free_index")
        start_pos = as_count("start_pos", start_pos)
        if slots.numel() == 0:
            return
        if start_pos % self.page_size:
            raise AlignmentError(f"segment start {start_pos} is not page-aligned")
        self._host_free_range(free_index, slots)
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
        """Free the SWA pages of a kv-row segment, zeroing their entries (see the reference;
        checked mode: the full slots in range and held)."""
        slots = self._as_index(free_index, "free_index")
        start_pos = as_count("start_pos", start_pos)
        if slots.numel() == 0:
            return
        self._host_range(free_index, slots, 0)
        if self.checked:
            self._check_range(slots, 0)
            self._check_full_held(slots)
        indices, pages = self._segment_swa_pages(slots, start_pos)
        self.full_to_swa_index_mapping.index_fill_(0, indices, RESERVED_INDEX)
        self.swa_attn_allocator.free_page_ids(pages)

    def free_segment(self, free_index: IndexLike, start_pos: int = 0) -> None:
        """Both pools' pages of a kv-row segment: the SWA side, then the full pool's
        ``free_segment`` (checked mode validates both first)."""
        slots = self._as_index(free_index, "free_index")
        start_pos = as_count("start_pos", start_pos)
        if slots.numel() == 0:
            return
        self._host_free_range(free_index, slots)
        full_alloc = self.full_attn_allocator
        if full_alloc._free_mask is not None:
            check_free_slots(slots, full_alloc._free_mask, self.page_size, False, None)
        indices, pages = self._segment_swa_pages(slots, start_pos)
        self.full_to_swa_index_mapping.index_fill_(0, indices, RESERVED_INDEX)
        self.swa_attn_allocator.free_page_ids(pages)
        full_alloc.free_segment(slots, start_pos)

    def free_group_begin(self) -> None:
        """Open a free group (both pools; under ``"group_end"`` this allocator alone).
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
        ``"group_end"``: the full slots, then the SWA slots their entries name now)."""
        if not self._in_free_group:
            raise InvalidArgumentError("free_group_end without free_group_begin")
        if not self._resolves_at_group_end():
            self.full_attn_allocator.free_group_end()
            self.swa_attn_allocator.free_group_end()
        elif self._group_slots:
            # one free of the concatenation; each side validates before any change
            slots = cat_index_parts(self._group_slots)
            indices, swa = self._resolve_swa(slots)
            self.full_attn_allocator.free(slots)
            self._release_swa(indices, swa)
        self._close_group()

    def _close_group(self) -> None:
        self._in_free_group = False
        self._group_slots = []
        if self._group_mask is not None:
            self._group_mask.zero_()

    # ----------------------------------------------------------------- state
    def backup_state(self) -> SWAState:
        """Both pools' free lists and a clone of the mapping. InvalidArgumentError inside an
        open free group (kvpool): the group's SWA slots are already unmapped but not yet free,
        so a restore to that state would leak them."""
        if self._in_free_group:
            raise InvalidArgumentError("backup_state inside an open free group")
        return (
            self.full_attn_allocator.backup_state(),
            self.swa_attn_allocator.backup_state(),
            self.full_to_swa_index_mapping.clone(),
        )

    def restore_state(self, state: object) -> None:
        """Put back a :meth:`backup_state` (checked mode validates it in full first; the
        errors: :func:`~kvpool.optimized.swa.mapping_ops.check_swa_state`)."""
        full, swa = self.full_attn_allocator, self.swa_attn_allocator
        shape, pages = self.full_to_swa_index_mapping.shape, (full.num_pages, swa.num_pages)
        full_state, swa_state, mapping = check_swa_state(state, shape, pages, self.checked)
        full.restore_state(full_state)
        swa.restore_state(swa_state)
        self.full_to_swa_index_mapping.copy_(mapping)

    def merge_and_sort_free(self) -> None:
        """Merge and sort both pools' release pages into their free pages."""
        self.full_attn_allocator.merge_and_sort_free()
        self.swa_attn_allocator.merge_and_sort_free()

    def clear(self) -> None:
        """Both pools empty, every entry 0 but the -1 tail, no open free group."""
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self.full_to_swa_index_mapping[:-1].fill_(RESERVED_INDEX)
        self._close_group()


__all__ = ["SWAState", "SWATokenToKVPoolAllocator"]

"""``HybridReqToTokenPool`` (optimized twin): the hybrid request table, mappings on the device.

Units and contract as :mod:`kvpool.reference.mamba.hybrid_req_to_token_pool`. Slot bookkeeping is
host work (:mod:`kvpool.optimized.mamba.allocator`): a request's ``mamba_pool_idx`` is an int
and its track buffer a list of ints, as in the reference. What the kernels read lives on the
device: the row-to-slot mappings (written with one indexed store per batch from one host-to-device
copy) and the state buffers (:mod:`kvpool.optimized.mamba.pool`). No device-to-host sync.
Kept slots (free, or named twice) are checked on the host, in both modes.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import torch

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    ReservedIndexError,
)
from kvpool.host_checks import as_int
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.mamba.allocator import MambaSlotAllocator
from kvpool.optimized.mamba.pool import MambaPool
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.protocols.requests import MambaReqLike
from kvpool.reference.mamba.hybrid_req_to_token_pool import (
    MAMBA_FIELDS,
    check_mamba_req,
    check_mamba_reqs,
    mamba_calls,
    mamba_calls_fit,
)
from kvpool.rules import Rules
from kvpool.snapshot import HybridReqToTokenSnapshot

NO_TRACK_SLOT = -1
"""A track-buffer entry that holds no slot."""


def _host(values: array[int], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor over ``values`` (no copy; the tensor keeps the array alive)."""
    return torch.frombuffer(values, dtype=dtype)


class HybridReqToTokenPool(ReqToTokenPool):
    """The table plus ``mamba_pool``, ``mamba_allocator`` and the device mappings."""

    def __init__(
        self,
        size: int,
        max_context_len: int,
        mamba_size: int,
        num_mamba_layers: int = 1,
        track_buffers: int = 0,
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
    ) -> None:
        if track_buffers not in (0, 1, 2):
            raise ConfigError(f"track_buffers must be 0, 1 or 2, got {track_buffers!r}")
        opts = twin_options(options)
        super().__init__(size, max_context_len, rules=rules, options=opts)
        self.mamba_pool = MambaPool(mamba_size, num_mamba_layers, options=opts)
        self.mamba_allocator = MambaSlotAllocator(mamba_size, options=opts)
        self.track_buffers = track_buffers
        self.req_index_to_mamba_index_mapping = torch.zeros(
            size + 1, dtype=torch.int32, device=self.device
        )
        self._on_host = self.req_index_to_mamba_index_mapping.device.type == "cpu"
        self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
            (size + 1, track_buffers), dtype=torch.int64, device=self.device
        )

    def _device(self, host: torch.Tensor) -> torch.Tensor:
        """``host`` on the pool's device (one asynchronous copy; none on the CPU)."""
        return host if self._on_host else host.to(self.device, non_blocking=True)

    def mamba_slots_needed(self, reqs: Sequence[MambaReqLike]) -> int:
        """Mamba slots :meth:`alloc` would take (see the reference)."""
        reqs = check_mamba_reqs("reqs", reqs)
        need, t = 0, self.track_buffers
        for req in reqs:  # one pass
            if req.mamba_pool_idx is None:
                need += 1
            if t and req.mamba_ping_pong_track_buffer is None:
                need += t
        return need

    def check_alloc(self, reqs: Sequence[MambaReqLike]) -> int:  # type: ignore[override]
        """The base check after the hybrid request checks and the kept slots' (see the
        reference); returns the fresh rows needed. Host values: both modes."""
        checked = check_mamba_reqs("reqs", reqs)
        fresh = super().check_alloc(checked)
        self._check_kept_slots(checked)
        return fresh

    def _check_slot(self, what: str, slot: int) -> None:
        """A Mamba slot named by a request: in ``1..size`` (slot 0 ReservedIndexError)."""
        if slot == RESERVED_INDEX:
            raise ReservedIndexError(f"{what}: Mamba slot {RESERVED_INDEX} is reserved")
        if not RESERVED_INDEX < slot <= self.mamba_allocator.size:
            raise IndexOutOfRangeError(
                f"{what}: Mamba slot {slot} outside 1..{self.mamba_allocator.size}"
            )

    def _check_kept_slots(self, reqs: Sequence[MambaReqLike]) -> None:
        """A kept slot must be in range, held and named by one request only; a kept track
        buffer has ``track_buffers`` entries (host values: both modes)."""
        alloc = self.mamba_allocator
        group = set(alloc._group or ())
        kept: set[int] = set()
        for i, req in enumerate(reqs):
            held = [] if req.mamba_pool_idx is None else [req.mamba_pool_idx]
            track = req.mamba_ping_pong_track_buffer
            if track is not None and len(track) != self.track_buffers:
                raise InvalidArgumentError(
                    f"request {i} keeps {len(track)} track buffers, the pool has "
                    f"{self.track_buffers}"
                )
            held += [s for s in track or () if s != NO_TRACK_SLOT]
            for slot in held:
                self._check_slot(f"request {i}", slot)
                free = alloc._is_free[slot]
                if free or slot in group or slot in kept:
                    raise InvalidArgumentError(
                        f"request {i} keeps Mamba slot {slot}, free or shared"
                    )
                kept.add(slot)

    def alloc(self, reqs: Sequence[MambaReqLike]) -> list[int] | None:  # type: ignore[override]
        """Rows, then the missing Mamba slots and track buffers in SGLang's order (see the
        reference); None and no change when rows or Mamba slots are short. The batch is
        validated once; the mappings of its rows are written from one host-to-device copy."""
        fresh_rows = self.check_alloc(reqs)
        if fresh_rows > len(self.free_slots):
            return None
        alloc, t = self.mamba_allocator, self.track_buffers
        group = alloc._group
        if group:  # single-slot calls take the group's prefetched slots: SGLang's calls
            calls = mamba_calls(reqs, t)
            if not mamba_calls_fit(calls, len(group), alloc.available_size()):
                return None
        else:  # one call hands out the same slots as SGLang's calls from the free list
            calls = [self.mamba_slots_needed(reqs)]
            if calls[0] > alloc.available_size():
                return None
        slots: list[int] = []
        for n in calls:
            got = alloc.alloc(n)
            assert got is not None  # counted above
            slots += got
        taken = iter(self._take_rows(fresh_rows))
        generation = self.req_generation
        rows: list[int] = []
        running: list[int] = []
        tracks: list[int] = []
        at = 0
        for req in reqs:
            if req.req_pool_idx is None:
                row = next(taken)
                generation[row] += 1
                req.req_pool_idx = row
            rows.append(req.req_pool_idx)
            if req.mamba_pool_idx is None:
                req.mamba_pool_idx = slots[at]
                req.mamba_needs_clear = True
                at += 1
            running.append(req.mamba_pool_idx)
            if t:
                if req.mamba_ping_pong_track_buffer is None:
                    req.mamba_ping_pong_track_buffer = slots[at : at + t]
                    req.mamba_next_track_idx = 0
                    at += t
                tracks += req.mamba_ping_pong_track_buffer
        if reqs:
            # array -> frombuffer: a list of ints reaches torch several times faster this way
            # than through torch.tensor(list); index_copy_ is the cheapest indexed store.
            index = self._device(_host(array("q", rows), torch.int64))
            mapped = self._device(_host(array("i", running), torch.int32))
            self.req_index_to_mamba_index_mapping.index_copy_(0, index, mapped)
            if t:
                track = self._device(_host(array("q", tracks), torch.int64).view(len(rows), t))
                self.req_index_to_mamba_ping_pong_track_buffer_mapping.index_copy_(0, index, track)
        return rows

    def get_mamba_indices(self, rows: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The Mamba slot mapped to each row (int32, on the device). A 1-D integer index
        (InvalidArgumentError otherwise, both modes); rows in ``1..size`` checked for host
        sequences always, for tensors in checked mode (a device read)."""
        index = index_tensor("rows", rows, self.device)
        if not isinstance(rows, torch.Tensor) or self.checked:
            for r in index.tolist():
                self._check_row(r)
        try:  # unchecked: a row past the table fails here (a read: nothing changed)
            return self.req_index_to_mamba_index_mapping[index]
        except IndexError as exc:
            raise IndexOutOfRangeError(f"rows outside 0..{self.size}: {exc}") from None

    def free_mamba_cache(
        self, req: MambaReqLike, mamba_ping_pong_track_buffer_to_keep: int | None = None
    ) -> None:
        """Free the request's Mamba slot and its track buffers except entry
        ``mamba_ping_pong_track_buffer_to_keep`` (see the reference), in one allocator call."""
        check_mamba_req("req", req, MAMBA_FIELDS)
        if req.mamba_pool_idx is None:
            raise DoubleFreeError("request holds no Mamba slot (mamba_pool_idx is None)")
        keep = mamba_ping_pong_track_buffer_to_keep
        if keep is not None:
            keep = as_int("mamba_ping_pong_track_buffer_to_keep", keep)
        if keep is not None and (not self.track_buffers or keep not in range(self.track_buffers)):
            raise InvalidArgumentError(f"track buffer to keep {keep!r} with {self.track_buffers}")
        track = req.mamba_ping_pong_track_buffer or []
        self.mamba_allocator.free(
            [req.mamba_pool_idx] + [s for i, s in enumerate(track) if i != keep]
        )
        req.mamba_pool_idx = None
        req.mamba_needs_clear = False
        req.mamba_cow_src_index = None
        if self.track_buffers:
            req.mamba_ping_pong_track_buffer = None
            req.mamba_next_track_idx = None

    def clear(self) -> None:
        """Every row and Mamba slot free; mappings zeroed (state kept)."""
        super().clear()
        if hasattr(self, "mamba_allocator"):  # the base constructor clears before we exist
            self.mamba_allocator.clear()
            self.req_index_to_mamba_index_mapping.zero_()
            self.req_index_to_mamba_ping_pong_track_buffer_mapping.zero_()

    def hybrid_snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> HybridReqToTokenSnapshot:
        """Plain copy of the table, allocator, state tags and mappings (syncs)."""
        # one host read per mapping (torch lists integer tensors as ints, with no view made)
        tracks: list[list[int]] = self.req_index_to_mamba_ping_pong_track_buffer_mapping.tolist()
        mapping: list[int] = self.req_index_to_mamba_index_mapping.tolist()
        # no rows asked (a memory manager's snapshot reads them itself): nothing to check
        empty = type(rows) is tuple and not rows
        return HybridReqToTokenSnapshot(
            table=self._snapshot_of(()) if empty else self.snapshot(rows),
            mamba_allocator=self.mamba_allocator.snapshot(),
            mamba_pool=self.mamba_pool.snapshot(),
            mamba_mapping=tuple(mapping),
            track_mapping=tuple(map(tuple, tracks)),
        )


__all__ = ["NO_TRACK_SLOT", "HybridReqToTokenPool"]

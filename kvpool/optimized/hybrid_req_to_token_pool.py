"""``HybridReqToTokenPool`` (optimized twin): the hybrid request table, mappings on the device.

Units and contract as :mod:`kvpool.reference.hybrid_req_to_token_pool`. Slot bookkeeping is
host work (:mod:`kvpool.optimized.mamba_allocator`): a request's ``mamba_pool_idx`` is an int
and its track buffer a list of ints, as in the reference. What the kernels read lives on the
device: the row-to-slot mappings (written with one indexed store per batch from one host-to-device
copy) and the state buffers (:mod:`kvpool.optimized.mamba_pool`). No device-to-host sync.
``checked`` adds the scan of kept slots (free, or named twice) that the reference always does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvpool.errors import ConfigError, DoubleFreeError, InvalidArgumentError
from kvpool.optimized.mamba_allocator import MambaSlotAllocator
from kvpool.optimized.mamba_pool import MambaPool
from kvpool.optimized.req_to_token_pool import ReqToTokenPool
from kvpool.protocols import MambaReqLike
from kvpool.reference.hybrid_req_to_token_pool import mamba_calls, mamba_calls_fit
from kvpool.rules import Rules
from kvpool.snapshot import HybridReqToTokenSnapshot

NO_TRACK_SLOT = -1
"""A track-buffer entry that holds no slot."""


class HybridReqToTokenPool(ReqToTokenPool):
    """The table plus ``mamba_pool``, ``mamba_allocator`` and the device mappings."""

    def __init__(
        self,
        size: int,
        max_context_len: int,
        mamba_size: int,
        num_mamba_layers: int = 1,
        track_buffers: int = 0,
        device: str | torch.device = "cpu",
        checked: bool | None = None,
        *,
        rules: Rules | None = None,
    ) -> None:
        if track_buffers not in (0, 1, 2):
            raise ConfigError(f"track_buffers must be 0, 1 or 2, got {track_buffers!r}")
        super().__init__(size, max_context_len, device=device, checked=checked, rules=rules)
        self.mamba_pool = MambaPool(mamba_size, num_mamba_layers, device=device, checked=checked)
        self.mamba_allocator = MambaSlotAllocator(mamba_size, checked=checked)
        self.track_buffers = track_buffers
        self.req_index_to_mamba_index_mapping = torch.zeros(
            size + 1, dtype=torch.int32, device=self.device
        )
        self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
            (size + 1, track_buffers), dtype=torch.int64, device=self.device
        )

    def mamba_slots_needed(self, reqs: Sequence[MambaReqLike]) -> int:
        """Mamba slots :meth:`alloc` would take (see the reference)."""
        need = sum(1 for r in reqs if r.mamba_pool_idx is None)
        if self.track_buffers:
            need += self.track_buffers * sum(
                1 for r in reqs if r.mamba_ping_pong_track_buffer is None
            )
        return need

    def _check_kept_slots(self, reqs: Sequence[MambaReqLike]) -> None:
        """Checked mode: a kept slot must be held and named by one request only."""
        alloc = self.mamba_allocator
        free = set(alloc.free_slots[alloc._head :]) | set(alloc._group or ())
        kept: set[int] = set()
        for i, req in enumerate(reqs):
            held = [] if req.mamba_pool_idx is None else [req.mamba_pool_idx]
            held += [s for s in req.mamba_ping_pong_track_buffer or () if s != NO_TRACK_SLOT]
            for slot in held:
                if slot in free or slot in kept:
                    raise InvalidArgumentError(
                        f"request {i} keeps Mamba slot {slot}, free or shared"
                    )
                kept.add(slot)

    def alloc(self, reqs: Sequence[MambaReqLike]) -> list[int] | None:  # type: ignore[override]
        """Rows, then every missing Mamba slot and track buffer in one allocator call, handed
        out in batch order (see the reference); None and no change when rows or Mamba slots
        are short. The mappings of the batch's rows are written with one store each."""
        fresh_rows = self.check_alloc(reqs)
        if self.checked:
            self._check_kept_slots(reqs)
        if fresh_rows > len(self.free_slots):
            return None
        calls = mamba_calls(reqs, self.track_buffers)
        group = self.mamba_allocator._group or []
        if not mamba_calls_fit(calls, len(group), self.mamba_allocator.available_size()):
            return None
        rows = super().alloc(reqs)
        assert rows is not None  # checked above
        slots: list[int] = []
        for n in calls if group else [sum(calls)]:  # see the reference: SGLang's calls
            got = self.mamba_allocator.alloc(n)
            assert got is not None  # counted above
            slots += got
        at, t = 0, self.track_buffers
        for req in reqs:
            if req.mamba_pool_idx is None:
                req.mamba_pool_idx = slots[at]
                req.mamba_needs_clear = True
                at += 1
            if t and req.mamba_ping_pong_track_buffer is None:
                req.mamba_ping_pong_track_buffer = slots[at : at + t]
                req.mamba_next_track_idx = 0
                at += t
        if reqs:
            index = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
            mapped = torch.tensor([r.mamba_pool_idx for r in reqs], dtype=torch.int32)
            self.req_index_to_mamba_index_mapping[index] = mapped.to(self.device, non_blocking=True)
            if t:
                tracks = torch.tensor([r.mamba_ping_pong_track_buffer for r in reqs])
                self.req_index_to_mamba_ping_pong_track_buffer_mapping[index] = tracks.to(
                    self.device, non_blocking=True
                )
        return rows

    def get_mamba_indices(self, rows: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The Mamba slot mapped to each row (int32, on the device)."""
        index = torch.as_tensor(rows, dtype=torch.int64, device=self.device)
        if not isinstance(rows, torch.Tensor):
            for r in index.tolist():
                self._check_row(r)
        return self.req_index_to_mamba_index_mapping[index]

    def free_mamba_cache(
        self, req: MambaReqLike, mamba_ping_pong_track_buffer_to_keep: int | None = None
    ) -> None:
        """Free the request's Mamba slot and its track buffers except entry
        ``mamba_ping_pong_track_buffer_to_keep`` (see the reference), in one allocator call."""
        if req.mamba_pool_idx is None:
            raise DoubleFreeError("request holds no Mamba slot (mamba_pool_idx is None)")
        keep = mamba_ping_pong_track_buffer_to_keep
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
        tracks = self.req_index_to_mamba_ping_pong_track_buffer_mapping.tolist()
        return HybridReqToTokenSnapshot(
            table=self.snapshot(rows),
            mamba_allocator=self.mamba_allocator.snapshot(),
            mamba_pool=self.mamba_pool.snapshot(),
            mamba_mapping=tuple(int(s) for s in self.req_index_to_mamba_index_mapping.tolist()),
            track_mapping=tuple(tuple(int(s) for s in t) for t in tracks),
        )


__all__ = ["NO_TRACK_SLOT", "HybridReqToTokenPool"]

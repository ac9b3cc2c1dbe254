"""``MambaSlotAllocator`` (optimized twin): the Mamba slot free list as an int64 tensor.

Units: slots ``1..size`` (slot 0 reserved). Same queue order, results and errors as
:mod:`kvpool.reference.mamba_allocator`; results are int64 tensors on ``device``. Hot paths
slice and concatenate tensors and compare lengths (host metadata): no device-to-host sync.
``checked`` (see :mod:`kvpool.optimized.checked`) adds the reference's misuse checks on freed
slots (reserved, out of range, already free), kept up to date in a device bool mask.
"""

from __future__ import annotations

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
from kvpool.optimized.checked import resolve_checked
from kvpool.snapshot import MambaAllocatorSnapshot


class MambaSlotAllocator:
    """Free list ``free_slots`` (int64, hand-out order) and the open group's prefetched slots."""

    def __init__(
        self, size: int, device: str | torch.device = "cpu", checked: bool | None = None
    ) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ConfigError(f"size must be a positive number of Mamba slots, got {size!r}")
        self.size = size
        self.device = torch.device(device)
        self.checked = resolve_checked(checked)
        self.free_slots = torch.empty(0, dtype=torch.int64, device=self.device)
        self._group: torch.Tensor | None = None
        self._group_next = 0
        # Checked mode only: free_mask[slot] is True while the slot is free or prefetched.
        self._free_mask = torch.zeros(size + 1, dtype=torch.bool, device=self.device)
        self.clear()

    def available_size(self) -> int:
        """Free slots (tensor length: host metadata, no sync)."""
        return int(self.free_slots.numel())

    def schedulable_available_size(self) -> int:
        """Equal to :meth:`available_size` for this static pool (see the reference)."""
        return self.available_size()

    def _take(self, need_size: int) -> torch.Tensor | None:
        if need_size > self.free_slots.numel():
            return None
        taken, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return taken

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots from the head (one slot inside an open group: the group's next
        prefetched slot while any is left); None and no change when fewer are free."""
        if not isinstance(need_size, int) or isinstance(need_size, bool) or need_size < 0:
            raise InvalidArgumentError(f"need_size must be an int >= 0, got {need_size!r}")
        group = self._group
        if group is not None and need_size == 1 and self._group_next < group.numel():
            slot = group[self._group_next : self._group_next + 1]
            self._group_next += 1
            self._mark(slot, False)
            return slot
        taken = self._take(need_size)
        if taken is not None:
            self._mark(taken, False)
        return taken

    def alloc_group_begin(self, num_reqs: int) -> None:
        """Open a group prefetching ``num_reqs`` slots (see the reference)."""
        if not isinstance(num_reqs, int) or isinstance(num_reqs, bool) or num_reqs < 0:
            raise InvalidArgumentError(f"num_reqs must be an int >= 0, got {num_reqs!r}")
        self.alloc_group_end()
        taken = self._take(num_reqs) if num_reqs > 0 else None
        self._group = taken if taken is not None else self.free_slots[:0]
        self._group_next = 0

    def alloc_group_end(self) -> None:
        """Close the group: unused prefetched slots go back to the tail, in order."""
        if self._group is not None:
            leftover = self._group[self._group_next :]
            self._group, self._group_next = None, 0
            self.free_slots = torch.cat((self.free_slots, leftover))

    def _mark(self, slots: torch.Tensor, free: bool) -> None:
        if self.checked:
            self._free_mask[slots] = free

    def _check(self, slots: torch.Tensor) -> None:
        """Checked mode: the reference's errors, before any change (syncs)."""
        values = [int(s) for s in slots.tolist()]
        for s in values:
            if s == RESERVED_INDEX:
                raise ReservedIndexError(f"Mamba slot {RESERVED_INDEX} is reserved")
            if not RESERVED_INDEX < s <= self.size:
                raise IndexOutOfRangeError(f"Mamba slot {s} outside 1..{self.size}")
        free = self._free_mask[slots].tolist()
        seen: set[int] = set()
        bad: list[int] = []
        for s, is_free in zip(values, free, strict=True):
            if is_free or s in seen:
                bad.append(s)
            seen.add(s)
        if bad:
            raise DoubleFreeError("Mamba slots already free (or freed twice in one call)", bad)

    def free(self, indices: torch.Tensor | Sequence[int]) -> None:
        """Append ``indices`` to the tail of the free list, in order (checked mode: the
        reference's errors for slot 0, out-of-range and already-free slots)."""
        slots = torch.as_tensor(indices, dtype=torch.int64, device=self.device).reshape(-1)
        if slots.numel() == 0:
            return
        if self.checked:
            self._check(slots)
        self._mark(slots, True)
        self.free_slots = torch.cat((self.free_slots, slots))

    def clear(self) -> None:
        """Every slot free, in order ``1..size``; an open group is dropped."""
        self._group, self._group_next = None, 0
        self.free_slots = torch.arange(
            RESERVED_INDEX + 1, self.size + 1, dtype=torch.int64, device=self.device
        )
        self._free_mask.fill_(True)
        self._free_mask[RESERVED_INDEX] = False

    def snapshot(self) -> MambaAllocatorSnapshot:
        """Plain copy of the free list and the group's prefetched slots (syncs)."""
        group = () if self._group is None else tuple(self._group[self._group_next :].tolist())
        return MambaAllocatorSnapshot(
            size=self.size,
            free_slots=tuple(int(s) for s in self.free_slots.tolist()),
            group_slots=tuple(int(s) for s in group),
            in_group=self._group is not None,
        )


__all__ = ["MambaSlotAllocator"]

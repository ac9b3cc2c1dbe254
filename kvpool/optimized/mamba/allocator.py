"""``MambaSlotAllocator`` (optimized twin): the Mamba slot free list, kept on the host.

Units: slots ``1..size`` (slot 0 reserved). Same queue order, results and errors as
:mod:`kvpool.reference.mamba.allocator`. Like the twin's free rows
(:mod:`kvpool.optimized.pools.req_to_token_pool`), slot bookkeeping is scheduler work: the free list
is a host list of ints (SGLang keeps it as a device tensor), so handing out and taking back slots
never touches the device, and the pool writes the slots to the device once per batch. Every check is
on host ints, so every check is always done (checked mode changes nothing here): range, reserved
slot, and a slot already free (a host byte per slot, O(1) per freed slot).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    ReservedIndexError,
)
from kvpool.host_checks import int_list
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.snapshot import MambaAllocatorSnapshot


class MambaSlotAllocator:
    """Free list ``free_slots`` (hand-out order) and the open group's prefetched slots."""

    def __init__(self, size: int, *, options: TwinOptions | None = None) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ConfigError(f"size must be a positive number of Mamba slots, got {size!r}")
        self.size = size
        self.options = twin_options(options)
        self.checked = self.options.checked
        self.free_slots: list[int] = []
        self._head = 0  # free_slots[:_head] were handed out; compacted when half is dead
        self._group: list[int] | None = None
        self._is_free = bytearray(size + 1)  # 1 while the slot is in free_slots[_head:]
        self.clear()

    def available_size(self) -> int:
        """Free slots (those an open group prefetched are not counted)."""
        return len(self.free_slots) - self._head

    def schedulable_available_size(self) -> int:
        """Equal to :meth:`available_size` for this static pool (see the reference)."""
        return self.available_size()

    def _take(self, need_size: int) -> list[int] | None:
        # Advance a head index instead of slicing the list: O(need), not O(free).
        if need_size > self.available_size():
            return None
        taken = self.free_slots[self._head : self._head + need_size]
        for s in taken:
            self._is_free[s] = 0
        self._head += need_size
        if self._head * 2 > len(self.free_slots):
            del self.free_slots[: self._head]
            self._head = 0
        return taken

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` slots from the head (one slot inside an open group: the group's next
        prefetched slot while any is left); None and no change when fewer are free."""
        if not isinstance(need_size, int) or isinstance(need_size, bool) or need_size < 0:
            raise InvalidArgumentError(f"need_size must be an int >= 0, got {need_size!r}")
        if self._group and need_size == 1:
            return [self._group.pop(0)]
        return self._take(need_size)

    def alloc_group_begin(self, num_reqs: int) -> None:
        """Open a group prefetching ``num_reqs`` slots (see the reference)."""
        if not isinstance(num_reqs, int) or isinstance(num_reqs, bool) or num_reqs < 0:
            raise InvalidArgumentError(f"num_reqs must be an int >= 0, got {num_reqs!r}")
        self.alloc_group_end()
        self._group = (self._take(num_reqs) or []) if num_reqs > 0 else []

    def alloc_group_end(self) -> None:
        """Close the group: unused prefetched slots go back to the tail, in order."""
        if self._group is not None:
            leftover, self._group = self._group, None
            self._put(leftover)

    def _put(self, slots: list[int]) -> None:
        self.free_slots.extend(slots)
        for s in slots:
            self._is_free[s] = 1

    def free(self, indices: Sequence[int]) -> None:
        """Append ``indices`` to the tail of the free list, in order. Slot 0 and slots outside
        ``1..size`` raise, a free, prefetched or repeated slot raises DoubleFreeError, a
        non-integer InvalidArgumentError (a tensor or array: 1-D of an integer dtype, read to
        the host). Nothing changes on an error."""
        if isinstance(indices, torch.Tensor | np.ndarray):
            slots = index_tensor("Mamba slots", indices, "cpu").tolist()
        else:
            slots = int_list("Mamba slots", indices)
        for s in slots:
            if s == RESERVED_INDEX:
                raise ReservedIndexError(f"Mamba slot {RESERVED_INDEX} is reserved")
            if not RESERVED_INDEX < s <= self.size:
                raise IndexOutOfRangeError(f"Mamba slot {s} outside 1..{self.size}")
        group = set(self._group or ())
        seen: set[int] = set()
        bad: list[int] = []
        for s in slots:
            if self._is_free[s] or s in group or s in seen:
                bad.append(s)
            seen.add(s)
        if bad:
            raise DoubleFreeError("Mamba slots already free (or freed twice in one call)", bad)
        self._put(slots)

    def clear(self) -> None:
        """Every slot free, in order ``1..size``; an open group is dropped."""
        self._group = None
        self.free_slots = list(range(RESERVED_INDEX + 1, self.size + 1))
        self._head = 0
        self._is_free = bytearray(b"\x00" + b"\x01" * self.size)

    def snapshot(self) -> MambaAllocatorSnapshot:
        """Plain copy of the free list and the group's prefetched slots."""
        return MambaAllocatorSnapshot(
            size=self.size,
            free_slots=tuple(self.free_slots[self._head :]),
            group_slots=tuple(self._group or ()),
            in_group=self._group is not None,
        )


__all__ = ["MambaSlotAllocator"]

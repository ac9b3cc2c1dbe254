"""``MambaSlotAllocator``: the free list of Mamba state slots (one whole recurrent state each).

Units: slots ``1..size`` are allocatable; slot 0 is the reserved dummy that padded batches write.
Unlike the token allocators, a request holds whole slots (one for its running state, plus its
speculative track buffers), so there are no pages. The free list is a queue: :meth:`alloc`
takes from the head, :meth:`free` appends to the tail, and a fresh allocator hands out 1, 2, 3...

An alloc group (:meth:`alloc_group_begin` / :meth:`alloc_group_end`) takes the slots of a batch
of single-slot requests in one call up front; ``alloc(1)`` inside the group hands them out in
order, and the group's end returns the unused ones to the tail of the free list.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    ReservedIndexError,
)
from kvpool.host_checks import int_list
from kvpool.snapshot import MambaAllocatorSnapshot


class MambaSlotAllocator:
    """Free list ``free_slots`` (hand-out order) and the open group's prefetched slots."""

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ConfigError(f"size must be a positive number of Mamba slots, got {size!r}")
        self.size = size
        self.free_slots: list[int] = []
        self._free_set: set[int] = set()
        self._group: list[int] | None = None
        self.clear()

    def available_size(self) -> int:
        """Free slots (those an open group prefetched are not counted)."""
        return len(self.free_slots)

    def schedulable_available_size(self) -> int:
        """Slots the scheduler may plan with; equal to :meth:`available_size` for this static
        pool (SGLang's unified pool overrides it with a byte-coordinated count)."""
        return self.available_size()

    def _take(self, need_size: int) -> list[int] | None:
        if need_size > len(self.free_slots):
            return None
        taken, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        self._free_set.difference_update(taken)
        return taken

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` slots from the head of the free list (inside an open group, one slot is
        the group's next prefetched slot while any is left); ``None`` and no change when fewer
        are free. InvalidArgumentError for a negative or non-int size."""
        if not isinstance(need_size, int) or isinstance(need_size, bool) or need_size < 0:
            raise InvalidArgumentError(f"need_size must be an int >= 0, got {need_size!r}")
        if self._group and need_size == 1:
            return [self._group.pop(0)]
        return self._take(need_size)

    def alloc_group_begin(self, num_reqs: int) -> None:
        """Open a group prefetching ``num_reqs`` slots (none when that many are not free: the
        requests then allocate one by one). A group already open is closed first."""
        if not isinstance(num_reqs, int) or isinstance(num_reqs, bool) or num_reqs < 0:
            raise InvalidArgumentError(f"num_reqs must be an int >= 0, got {num_reqs!r}")
        self.alloc_group_end()
        self._group = (self._take(num_reqs) or []) if num_reqs > 0 else []

    def alloc_group_end(self) -> None:
        """Close the group: its unused prefetched slots go back to the tail, in order."""
        if self._group is not None:
            leftover, self._group = self._group, None
            self._put(leftover)

    def _check(self, indices: Sequence[int]) -> list[int]:
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
            if s in self._free_set or s in group or s in seen:
                bad.append(s)
            seen.add(s)
        if bad:
            raise DoubleFreeError("Mamba slots already free (or freed twice in one call)", bad)
        return slots

    def _put(self, slots: list[int]) -> None:
        self.free_slots.extend(slots)
        self._free_set.update(slots)

    def free(self, indices: Sequence[int]) -> None:
        """Append ``indices`` to the tail of the free list, in order. Slot 0 is
        ReservedIndexError, a slot outside ``1..size`` IndexOutOfRangeError, a free (or
        prefetched, or repeated) slot DoubleFreeError; nothing changes on an error."""
        self._put(self._check(indices))

    def clear(self) -> None:
        """Every slot free, in order ``1..size``; an open group is dropped."""
        self._group = None
        self.free_slots = list(range(RESERVED_INDEX + 1, self.size + 1))
        self._free_set = set(self.free_slots)

    def snapshot(self) -> MambaAllocatorSnapshot:
        """Plain copy of the free list and the group's prefetched slots."""
        return MambaAllocatorSnapshot(
            size=self.size,
            free_slots=tuple(self.free_slots),
            group_slots=tuple(self._group or ()),
            in_group=self._group is not None,
        )


__all__ = ["MambaSlotAllocator"]

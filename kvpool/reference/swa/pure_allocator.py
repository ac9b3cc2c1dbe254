"""``PureSWATokenToKVPoolAllocator``: the allocator of a model whose every layer is
sliding-window (SGLang's, page size 1 only).

One :class:`~kvpool.reference.pools.token_allocator.TokenToKVPoolAllocator` serves as both the
full and the SWA side; the mapping is the identity (with the -1 tail), so translation changes
nothing. ``free`` and ``free_swa`` both free the slots, dropping 0 entries (padding) as SGLang
does; the pool's other errors are the token allocator's.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX
from kvpool.errors import ConfigError, IndexOutOfRangeError
from kvpool.host_checks import int_list
from kvpool.reference.pools.allocator import FreeListState
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator
from kvpool.rules import Rules
from kvpool.snapshot import SWAAllocatorSnapshot


class PureSWATokenToKVPoolAllocator:
    """A model whose every layer is sliding-window: one page-size-1 pool of ``size_swa`` tokens
    serves as both sides; the mapping is the identity (with the -1 tail). ``free`` and
    ``free_swa`` both free the slots, dropping 0 entries (padding) as SGLang does.
    ConfigError for a page size other than 1."""

    def __init__(
        self,
        size_swa: int,
        page_size: int = 1,
        need_sort: bool = False,
        *,
        rules: Rules | None = None,
    ) -> None:
        if page_size != 1:
            raise ConfigError(f"pure SWA supports page_size 1 only, got {page_size}")
        self.swa_attn_allocator = TokenToKVPoolAllocator(size_swa, need_sort, rules=rules)
        self.full_attn_allocator = self.swa_attn_allocator
        self.page_size = 1
        self.need_sort = bool(need_sort)
        self._size_swa = size_swa
        self.full_to_swa_index_mapping = [*range(size_swa + 1), NO_LAST_LOC]

    @property
    def size(self) -> int:
        return self._size_swa

    size_full = size_swa = size

    def available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    full_available_size = swa_available_size = available_size

    def snapshot(self) -> SWAAllocatorSnapshot:
        snap = self.swa_attn_allocator.snapshot()
        return SWAAllocatorSnapshot(snap, snap, tuple(self.full_to_swa_index_mapping), pure=True)

    def translate_loc_from_full_to_swa(self, kv_indices: Sequence[int]) -> list[int]:
        """The identity (IndexOutOfRangeError outside ``[-1, size + 1)``)."""
        locs = int_list("slots", kv_indices)
        bad = [x for x in locs if not NO_LAST_LOC <= x <= self._size_swa]
        if bad:
            raise IndexOutOfRangeError(f"slots out of range: {bad}")
        return locs

    def alloc(self, need_size: int) -> list[int] | None:
        return self.swa_attn_allocator.alloc(need_size)

    def free(self, free_index: Sequence[int]) -> None:
        """Free the slots, dropping 0 entries (padding) as SGLang does; the token allocator's
        errors (InvalidArgumentError for non-integers, before the padding is dropped)."""
        slots = int_list("free_index", free_index)
        self.swa_attn_allocator.free([s for s in slots if s != RESERVED_INDEX])

    free_swa = free

    def free_group_begin(self) -> None:
        self.swa_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        self.swa_attn_allocator.free_group_end()

    def backup_state(self) -> FreeListState:
        return self.swa_attn_allocator.backup_state()

    def restore_state(self, state: object) -> None:
        self.swa_attn_allocator.restore_state(state)

    def merge_and_sort_free(self) -> None:
        self.swa_attn_allocator.merge_and_sort_free()

    def clear(self) -> None:
        self.swa_attn_allocator.clear()


__all__ = ["PureSWATokenToKVPoolAllocator"]

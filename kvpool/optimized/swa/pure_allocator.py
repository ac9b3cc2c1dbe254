"""``PureSWATokenToKVPoolAllocator`` (optimized twin): the allocator of a model whose every
layer is sliding-window.

Twin of :mod:`kvpool.reference.swa.pure_allocator`: one
:class:`~kvpool.optimized.pools.token_allocator.TokenToKVPoolAllocator` serves as both sides; the
mapping is the identity tensor (with the -1 tail).
"""

from __future__ import annotations

import numpy as np
import torch

from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX
from kvpool.errors import ConfigError, IndexOutOfRangeError
from kvpool.host_checks import int_list
from kvpool.optimized.host_view import host_array
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.optimized.pools.allocator import FreeListState
from kvpool.optimized.pools.token_allocator import TokenToKVPoolAllocator
from kvpool.optimized.swa.allocator import IndexLike
from kvpool.rules import Rules
from kvpool.snapshot import SWAAllocatorSnapshot


class PureSWATokenToKVPoolAllocator:
    """Every layer sliding-window: one page-size-1 pool serves as both sides; the mapping is the
    identity (twin of the reference class)."""

    def __init__(
        self,
        size_swa: int,
        page_size: int = 1,
        need_sort: bool = False,
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
    ) -> None:
        if page_size != 1:
            raise ConfigError(f"pure SWA supports page_size 1 only, got {page_size}")
        self.options = twin_options(options)
        self.checked = self.options.checked
        self.swa_attn_allocator = TokenToKVPoolAllocator(
            size_swa, need_sort, rules=rules, options=self.options
        )
        self.full_attn_allocator = self.swa_attn_allocator
        self.page_size = 1
        self.need_sort = bool(need_sort)
        self.device = self.options.device
        self._size_swa = size_swa
        self.full_to_swa_index_mapping = torch.arange(
            size_swa + 2, dtype=torch.int64, device=self.device
        )
        self.full_to_swa_index_mapping[-1] = NO_LAST_LOC

    @property
    def size(self) -> int:
        return self._size_swa

    size_full = size_swa = size

    def available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    full_available_size = swa_available_size = available_size

    def snapshot(self) -> SWAAllocatorSnapshot:
        snap = self.swa_attn_allocator.snapshot()
        mapping = tuple(host_array(self.full_to_swa_index_mapping).tolist())
        return SWAAllocatorSnapshot(snap, snap, mapping, pure=True)

    def translate_loc_from_full_to_swa(self, kv_indices: IndexLike) -> torch.Tensor:
        """The identity: InvalidArgumentError unless ``kv_indices`` is a 1-D integer index
        argument (both modes); IndexOutOfRangeError outside ``[-1, size + 1)`` in checked mode,
        or always for host values (no device read for them)."""
        locs = index_tensor("kv_indices", kv_indices, self.device)
        if self.checked or not isinstance(kv_indices, torch.Tensor):
            bad = (locs < NO_LAST_LOC) | (locs > self._size_swa)
            if bool(bad.any()):
                raise IndexOutOfRangeError(f"slots out of range: {locs[bad].tolist()}")
        return locs

    def alloc(self, need_size: int) -> torch.Tensor | None:
        return self.swa_attn_allocator.alloc(need_size)

    def free(self, free_index: IndexLike) -> None:
        """Free the slots, dropping 0 entries (padding) as SGLang does; the token allocator's
        errors. Host values stay host values (so its host range checks run in both modes)."""
        if isinstance(free_index, torch.Tensor):
            slots = index_tensor("free_index", free_index, self.device)
            self.swa_attn_allocator.free(slots[slots != RESERVED_INDEX])
            return
        if not isinstance(free_index, np.ndarray):
            kept = [s for s in int_list("free_index", free_index) if s != RESERVED_INDEX]
            self.swa_attn_allocator.free(kept)
            return
        slots = index_tensor("free_index", free_index, self.device)
        self.swa_attn_allocator.free(slots[slots != RESERVED_INDEX].tolist())

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

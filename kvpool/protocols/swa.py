"""The sliding-window family: what the lifecycle and the trees use of an SWA allocator and tree.

The rules every method shares: :mod:`kvpool.protocols`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from kvpool.protocols.index import IdxT
from kvpool.snapshot import (
    SWAAllocatorSnapshot,
    TreeSnapshot,
)

# ----------------------------------------------------------------- SWA family (swa/)
# What the SWA lifecycle (SWAMemoryManager and the window steps), the SWA radix tree and the
# unified FULL+SWA tree use of a sliding-window hybrid allocator, and what the lifecycle uses of a
# sliding-window prefix tree besides its walks (``match_prefix`` / ``insert`` take the twin's own
# key). kvpool's classes of either twin and SGLang's adapters (kvpool/sglang/swa.py,
# swa_radix.py) offer them. Units: tokens; full slots name tokens, SWA slots their window KV.

SWANodeT_contra = TypeVar("SWANodeT_contra", contravariant=True)
"""A sliding-window tree's own node class (each implementation's)."""


class SWAAllocatorProtocol(Protocol[IdxT]):
    """A full pool and a smaller SWA pool of the same page size, allocated in step and joined by
    a full-to-SWA slot mapping (0: no SWA slot; see :mod:`kvpool.reference.swa.allocator`)."""

    @property
    def page_size(self) -> int: ...

    @property
    def size(self) -> int:
        """Tokens both pools can hold: the smaller pool's size."""
        ...

    def available_size(self) -> int:
        """Tokens allocatable now in both pools: the smaller free count."""
        ...

    def full_available_size(self) -> int: ...

    def swa_available_size(self) -> int: ...

    def translate_loc_from_full_to_swa(self, kv_indices: IdxT) -> IdxT:
        """The SWA slot of each full slot (0 where it has none; -1 stays -1)."""
        ...

    def set_full_to_swa_mapping(self, full_indices: IdxT, swa_indices: IdxT) -> None:
        """``mapping[full_indices[i]] = swa_indices[i]`` (0 unmaps)."""
        ...

    def alloc(self, need_size: int) -> IdxT | None:
        """Page size 1: ``need_size`` full slots, each mapped to a new SWA slot; ``None`` (no
        change) unless both pools have room."""
        ...

    def alloc_extend(
        self,
        prefix_lens: IdxT,
        prefix_lens_cpu: Sequence[int],
        seq_lens: IdxT,
        seq_lens_cpu: Sequence[int],
        last_loc: IdxT,
        extend_num_tokens: int,
    ) -> IdxT | None:
        """Page size > 1: :meth:`PagedAllocatorProtocol.alloc_extend` on both pools in step."""
        ...

    def alloc_decode(
        self, seq_lens: IdxT, seq_lens_cpu: Sequence[int], last_loc: IdxT
    ) -> IdxT | None:
        """Page size > 1: :meth:`PagedAllocatorProtocol.alloc_decode` on both pools in step."""
        ...

    def free(self, free_index: IdxT) -> None:
        """Free full slots and the SWA slots their mapping names, zeroing those entries."""
        ...

    def free_swa(self, free_index: IdxT) -> None:
        """Free only the SWA slots of full slots (tokens that slid out of the window)."""
        ...

    def free_group_begin(self) -> None: ...

    def free_group_end(self) -> None: ...

    def backup_state(self) -> object:
        """Opaque copy of both free lists and the mapping."""
        ...

    def restore_state(self, state: object) -> None: ...

    def clear(self) -> None: ...

    def snapshot(self) -> SWAAllocatorSnapshot: ...


class SWATreeProtocol(Protocol[SWANodeT_contra]):
    """A sliding-window prefix tree's locks, eviction and sizes (see
    :mod:`kvpool.reference.swa.radix_cache`): a lock takes full locks up to the root and SWA
    locks only as far as the window reaches (returning the uuid its unlock stops at)."""

    @property
    def page_size(self) -> int: ...

    @property
    def sliding_window_size(self) -> int: ...

    def inc_lock_ref(self, node: SWANodeT_contra) -> int | None: ...

    def dec_lock_ref(
        self, node: SWANodeT_contra, swa_uuid_for_lock: int | None = None, skip_swa: bool = False
    ) -> None: ...

    def dec_swa_lock_only(
        self, node: SWANodeT_contra, swa_uuid_for_lock: int | None = None
    ) -> None: ...

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]:
        """Free at least ``num_tokens`` full and ``swa_num_tokens`` SWA tokens if the tree
        allows; returns (full tokens freed, SWA tokens freed)."""
        ...

    def full_evictable_size(self) -> int: ...

    def full_protected_size(self) -> int: ...

    def swa_evictable_size(self) -> int: ...

    def swa_protected_size(self) -> int: ...

    def reset(self) -> None: ...

    def snapshot(self) -> TreeSnapshot: ...


__all__ = ["SWAAllocatorProtocol", "SWANodeT_contra", "SWATreeProtocol"]

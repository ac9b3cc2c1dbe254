"""The hybrid Mamba family: state slots, their allocator and pool, the hybrid request table and the
Mamba tree.

The rules every method shares: :mod:`kvpool.protocols`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from kvpool.protocols.index import IdxT_contra
from kvpool.protocols.requests import MambaReqLike
from kvpool.snapshot import (
    HybridReqToTokenSnapshot,
    MambaAllocatorSnapshot,
    MambaPoolSnapshot,
    MambaTreeSnapshot,
)

# ----------------------------------------------------------------- Mamba family (mamba/)
# What the lifecycle (MambaHooks) and the unified FULL+MAMBA tree use of a hybrid (Mamba) model's
# request table, its state slots and their allocator, and of the Mamba radix tree. kvpool's
# classes of either twin and SGLang's adapters (kvpool/sglang/hybrid.py, mamba_radix.py) offer
# them. Units: tokens for KV; one Mamba slot holds one request's (or one checkpoint's) state.

MambaNodeT_contra = TypeVar("MambaNodeT_contra", contravariant=True)
"""A Mamba tree's own node class (each implementation's)."""


class MambaSlotAllocatorProtocol(Protocol):
    """Mamba state slots ``1..size`` (slot 0 reserved), with SGLang's allocation groups."""

    def available_size(self) -> int: ...

    def schedulable_available_size(self) -> int:
        """Free slots a new batch may count on (an open group's reservation excluded)."""
        ...

    def alloc(self, need_size: int) -> list[int] | None: ...

    def free(self, indices: Sequence[int]) -> None: ...

    def alloc_group_begin(self, num_reqs: int) -> None: ...

    def alloc_group_end(self) -> None: ...

    def clear(self) -> None: ...

    def snapshot(self) -> MambaAllocatorSnapshot: ...


class MambaPoolProtocol(Protocol[IdxT_contra]):
    """The state buffers of the Mamba slots: what the lifecycle writes, copies and reads."""

    def clear_slots(self, indices: IdxT_contra) -> None: ...

    def copy_from(self, src_indices: IdxT_contra, dst_indices: IdxT_contra) -> None:
        """Copy each source slot's state into the destination slot (copy-on-write)."""
        ...

    def write_state(self, indices: IdxT_contra, tags: IdxT_contra) -> None: ...

    def state_tags(self, indices: Sequence[int]) -> list[int]:
        """The tag of the state each slot holds (:func:`kvpool.tags.mamba_state_tag`)."""
        ...

    def snapshot(self) -> MambaPoolSnapshot: ...


class HybridReqToTokenPoolProtocol(Protocol):
    """What the lifecycle uses of a hybrid model's request table besides the plain table's
    calls: its Mamba slots (one per request holding a row, plus copy-on-write and track
    buffers), their allocator and a snapshot of both."""

    @property
    def mamba_allocator(self) -> MambaSlotAllocatorProtocol: ...

    def mamba_slots_needed(self, reqs: Sequence[MambaReqLike]) -> int:
        """Mamba slots an admission of ``reqs`` takes (those not holding one yet)."""
        ...

    def free_mamba_cache(
        self, req: MambaReqLike, mamba_ping_pong_track_buffer_to_keep: int | None = None
    ) -> None: ...

    def available_size(self) -> int: ...

    def clear(self) -> None: ...

    def hybrid_snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> HybridReqToTokenSnapshot: ...


class MambaTreeProtocol(Protocol[MambaNodeT_contra]):
    """A Mamba radix tree's locks, eviction and sizes (see
    :mod:`kvpool.reference.mamba.radix_cache`): a lock covers the node's state and the KV of its
    path to the root; eviction frees KV tokens and cached states."""

    def inc_lock_ref(self, node: MambaNodeT_contra) -> None: ...

    def dec_lock_ref(self, node: MambaNodeT_contra) -> None: ...

    def evict_mamba(self, mamba_num: int) -> int:
        """Free at least ``mamba_num`` cached states if the tree allows; returns those freed."""
        ...

    def evict(self, num_tokens: int = 0, mamba_num: int = 0) -> tuple[int, int]: ...

    def full_evictable_size(self) -> int: ...

    def mamba_evictable_size(self) -> int: ...

    def full_protected_size(self) -> int: ...

    def mamba_protected_size(self) -> int: ...

    def all_mamba_values(self) -> list[int]:
        """Every Mamba slot the tree holds (its checkpoints)."""
        ...

    def reset(self) -> None: ...

    def snapshot(self) -> MambaTreeSnapshot: ...


__all__ = [
    "HybridReqToTokenPoolProtocol",
    "MambaNodeT_contra",
    "MambaPoolProtocol",
    "MambaSlotAllocatorProtocol",
    "MambaTreeProtocol",
]

"""The host-tier family: the host KV pool, the controller of device <-> host transfers, and what
the lifecycle uses of a tree with a host tier.

The rules every method shares: :mod:`kvpool.protocols`.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from kvpool.protocols.index import IdxT, IdxT_contra
from kvpool.snapshot import (
    HostPoolSnapshot,
    HostTierSnapshot,
)

# ----------------------------------------------------------------- host tier (hicache/)
# The host-tier family: a host KV pool, the controller of device <-> host transfers, and what the
# request lifecycle uses of a tree with a host tier (kvpool's HiRadixCache of either twin, or an
# injected tree such as an SGLang adapter). Units: tokens; device slots and host slots.

AckT = TypeVar("AckT")
NodeT = TypeVar("NodeT")


class TaggedKVPoolProtocol(Protocol[IdxT_contra]):
    """What the host tier uses of a device KV pool: its geometry and the KV tags
    (:mod:`kvpool.tags`) stored at its slots."""

    @property
    def size(self) -> int:
        """Usable device slots (tokens)."""
        ...

    @property
    def page_size(self) -> int: ...

    @property
    def num_rows(self) -> int:
        """Rows per layer buffer: ``size + page_size``."""
        ...

    def read_tags(self, loc: IdxT_contra) -> list[int]:
        """The tag stored at each slot of ``loc`` (0 for a slot never written)."""
        ...

    def write_tags(self, loc: IdxT_contra, tags: IdxT_contra) -> None:
        """Store ``tags[i]`` at slot ``loc[i]`` on every layer."""
        ...


class HostPoolProtocol(Protocol[IdxT]):
    """A host KV pool: host slots ``0..size-1`` handed out in whole pages, each holding one KV
    tag (``tags``) copied from or to ``device_pool``'s slots. ``alloc`` returns None (nothing
    changed) when fewer slots are free; ``free`` of a slot not held raises
    :class:`kvpool.errors.DoubleFreeError` and changes nothing."""

    tags: IdxT

    @property
    def size(self) -> int:
        """Host slots (tokens)."""
        ...

    @property
    def page_size(self) -> int: ...

    @property
    def device_pool(self) -> TaggedKVPoolProtocol[IdxT]:
        """The device KV pool this pool backs."""
        ...

    def alloc(self, need_size: int) -> IdxT | None:
        """``need_size`` host slots (a page multiple), or None."""
        ...

    def free(self, indices: IdxT) -> int:
        """Release held host slots; returns how many."""
        ...

    def available_size(self) -> int:
        """Free host slots (tokens)."""
        ...

    def clear(self) -> None:
        """Every slot free, every tag 0."""
        ...

    def backup_from_device_all_layer(
        self, device_pool: TaggedKVPoolProtocol[IdxT], host_indices: IdxT, device_indices: IdxT
    ) -> None:
        """Copy the device slots' content into the host slots, slot for slot, all layers."""
        ...

    def load_to_device_all_layer(
        self, device_pool: TaggedKVPoolProtocol[IdxT], host_indices: IdxT, device_indices: IdxT
    ) -> None:
        """Copy the host slots' content into the device slots, slot for slot, all layers."""
        ...

    def snapshot(self) -> HostPoolSnapshot: ...


class HostControllerProtocol(Protocol[IdxT, AckT]):
    """The transfers between device slots and host slots (SGLang's ``HiCacheController``):
    ``AckT`` is one transfer in flight. Writes are issued at once (or queued with
    ``flush=False`` until ``start_writing``); loads are queued until ``start_loading``;
    ``complete`` copies a transfer's content when it has finished."""

    ack_write_queue: list[AckT]
    ack_load_queue: list[AckT]

    def write(self, device_indices: IdxT, node_id: int = -1, *, flush: bool = True) -> IdxT | None:
        """Reserve host slots for ``device_indices`` and queue the copy; None when full."""
        ...

    def start_writing(self) -> None:
        """Issue the queued writes as one transfer."""
        ...

    def load(self, host_indices: IdxT, node_id: int = -1) -> IdxT | None:
        """Reserve device slots for ``host_indices`` and queue the copy; None when full."""
        ...

    def start_loading(self) -> int:
        """Issue the queued loads as one transfer; its producer index (-1: none queued)."""
        ...

    def complete(self, ack: AckT) -> None:
        """The transfer ``ack`` has finished: copy its content."""
        ...


class HostTierTreeProtocol(Protocol[IdxT, NodeT, AckT]):
    """What the request lifecycle uses of a tree cache with a host tier (``NodeT``: the tree's
    node type): restoring a host-only prefix at admission, issuing loads before a forward and
    writes after a batch, and delivering acknowledgements."""

    @property
    def unified(self) -> bool:
        """Whether SGLang 0.5.23's host tier runs (writes queued until the end of a batch)."""
        ...

    @property
    def cache_controller(self) -> HostControllerProtocol[IdxT, AckT]: ...

    def init_load_back(self, node: NodeT, mem_quota: int | None = None) -> tuple[IdxT, NodeT]:
        """Restore ``node``'s host-only path into device slots; the restored slots (empty when
        nothing moved) and the deepest node on device the request should lock."""
        ...

    def ready_to_load_host_cache(self) -> int:
        """Issue the queued loads (one transfer); its producer index, -1 if none."""
        ...

    def writing_check(self, num_acks: int | None = None, write_back: bool = False) -> int:
        """Deliver the first ``num_acks`` write acknowledgements (all when None)."""
        ...

    def loading_check(self, num_acks: int | None = None) -> int:
        """Deliver the first ``num_acks`` load acknowledgements (all when None)."""
        ...

    def host_snapshot(self) -> HostTierSnapshot:
        """The whole host tier for :mod:`kvpool.invariants`."""
        ...


__all__ = [
    "AckT",
    "HostControllerProtocol",
    "HostPoolProtocol",
    "HostTierTreeProtocol",
    "NodeT",
    "TaggedKVPoolProtocol",
]

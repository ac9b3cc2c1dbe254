"""Read-only views of a ``HiRadixCache``: the tree snapshot with each node's host fields, and the
snapshot of the whole host tier.

Units: ``value`` holds device slots, ``host_value`` host slots; nothing is written. Nodes are
listed as :func:`~kvpool.reference.radix.tree_view.snapshot_tree` lists them (breadth-first from
the root), so both twins list them identically.
"""

from __future__ import annotations

from itertools import chain
from typing import Protocol

from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.records import fast_record
from kvpool.reference.hicache.cache_controller import HiCacheController
from kvpool.reference.hicache.prefetch import StoragePrefetch
from kvpool.reference.hicache.tree_node import HiTreeNode, as_hi
from kvpool.reference.kv.kv_cache import snapshot_tags
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.radix.tree_view import HostFields, TreeViewHost, snapshot_tree
from kvpool.reference.radix_key import TreeNode
from kvpool.snapshot import AllocatorSnapshot, HostTierSnapshot, TreeSnapshot


class HostTierView(TreeViewHost, Protocol):
    """What the views read of a ``HiRadixCache``; nothing is written."""

    @property
    def root_node(self) -> HiTreeNode: ...
    @property
    def write_policy(self) -> str: ...
    @property
    def cache_controller(self) -> HiCacheController: ...
    @property
    def token_to_kv_pool_allocator(self) -> BaseTokenToKVPoolAllocator: ...
    @property
    def token_to_kv_pool_host(self) -> HostPoolProtocol[list[int]]: ...
    @property
    def storage_prefetch(self) -> StoragePrefetch: ...
    @property
    def is_eagle(self) -> bool: ...
    def snapshot(self) -> TreeSnapshot: ...


_HOST_TIER = fast_record(HostTierSnapshot)
"""Builds a :class:`HostTierSnapshot` (every field by keyword: :func:`fast_record`)."""


def hi_tree_snapshot(tree: HostTierView) -> TreeSnapshot:
    """The tree snapshot; nodes carry their host fields (host slots, host pins, a pending
    write)."""
    return snapshot_tree(tree, _host_fields)


def _host_fields(node: TreeNode) -> HostFields:
    """A node's ``(evicted, host_value, host_ref_counter, write_pending)``."""
    n = as_hi(node)
    host = None if n.host_value is None else tuple(n.host_value)
    return n.evicted, host, n.host_ref_counter, n.write_through_pending_id is not None


def host_tier_snapshot(
    tree: HostTierView,
    tree_snapshot: TreeSnapshot | None = None,
    device: AllocatorSnapshot | None = None,
) -> HostTierSnapshot:
    """The whole host tier: device allocator, tree (``tree.snapshot()``), host pool, transfers
    in flight (queued loads included), prefetches, the release queue, the worker-held slots,
    device tags. ``tree_snapshot`` and ``device``: ``tree.snapshot()`` and the device
    allocator's snapshot when the caller took them at this instant (else taken here)."""
    cc = tree.cache_controller
    acks = cc.ack_write_queue + cc.write_queue + cc.ack_load_queue + cc.load_queue
    if device is None:
        device = tree.token_to_kv_pool_allocator.snapshot()
    rows = cc.mem_pool_device.num_rows
    return _HOST_TIER(
        write_policy=tree.write_policy,
        device=device,
        tree=tree.snapshot() if tree_snapshot is None else tree_snapshot,
        host=tree.token_to_kv_pool_host.snapshot(),
        transfers=tuple(a.snapshot() for a in acks),
        prefetches=tree.storage_prefetch.prefetch_snapshots(),
        release_queue=tuple(map(int, chain.from_iterable(cc.host_mem_release_queue))),
        worker_held=tuple(map(int, cc.worker_held())),
        device_tags=tuple(snapshot_tags(cc.mem_pool_device, list(range(rows)))),
        device_held=(),
        bigram_keys=tree.is_eagle,
    )


__all__ = ["HostTierView", "hi_tree_snapshot", "host_tier_snapshot"]

"""Read-only views of the optimized twin's ``HiRadixCache``: the tree snapshot with each node's
host fields, and the snapshot of the whole host tier.

Mirrors :mod:`kvpool.reference.hicache.tree_view` (same fields, same node order); device and
host slots are read out of their int64 tensors as plain integers. Nothing is written.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from kvpool.optimized.hicache.cache_controller import HiCacheController
from kvpool.optimized.hicache.prefetch import StoragePrefetch
from kvpool.optimized.hicache.tree_node import HiTreeNode, as_hi
from kvpool.optimized.radix.tree_view import TreeViewHost, bfs_nodes, node_keys
from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.protocols.pools import SegmentAllocatorProtocol
from kvpool.records import fast_record
from kvpool.snapshot import AllocatorSnapshot, HostTierSnapshot, NodeSnapshot, TreeSnapshot


class HostTierView(TreeViewHost, Protocol):
    """What the views read of a ``HiRadixCache``; nothing is written."""

    @property
    def root_node(self) -> HiTreeNode: ...
    @property
    def write_policy(self) -> str: ...
    @property
    def cache_controller(self) -> HiCacheController: ...
    @property
    def token_to_kv_pool_allocator(self) -> SegmentAllocatorProtocol[torch.Tensor]: ...
    @property
    def token_to_kv_pool_host(self) -> HostPoolProtocol[torch.Tensor]: ...
    @property
    def storage_prefetch(self) -> StoragePrefetch: ...
    def snapshot(self) -> TreeSnapshot: ...


_NODE = fast_record(NodeSnapshot)
"""Builds a :class:`NodeSnapshot` (every field by keyword: :func:`fast_record`)."""


def hi_tree_snapshot(tree: HostTierView) -> TreeSnapshot:
    """The tree snapshot; nodes carry their host fields (host slots, host pins, a pending
    write). The nodes of :func:`~kvpool.optimized.radix.tree_view.snapshot_tree`, each built
    once with its host fields (no copy of a node to add them)."""
    nodes: list[NodeSnapshot] = []
    ps = tree.page_size
    if not tree.disable:
        order = bfs_nodes(tree.root_node)
        keys = node_keys(order)
        for node in order:
            n = as_hi(node)
            children = node.children.values()
            nodes.append(
                _NODE(
                    node_id=node.node_id,
                    parent_id=None if node.parent is None else node.parent.node_id,
                    key=keys[id(node)],
                    extra_key=node.key.extra_key,
                    value=tuple(node.value.tolist()),
                    lock_ref=node.lock_ref,
                    child_ids=tuple([c.node_id for c in children]),
                    child_keys=tuple([keys[id(c)][:ps] for c in children]),
                    last_access_time=float(node.last_access_time),
                    hit_count=node.hit_count,
                    priority=node.priority,
                    swa_tombstone=False,
                    swa_lock_ref=0,
                    evicted=n.evicted,
                    host_value=None if n.host_value is None else tuple(n.host_value.tolist()),
                    host_ref_counter=n.host_ref_counter,
                    write_pending=n.write_through_pending_id is not None,
                )
            )
    return TreeSnapshot(
        page_size=ps,
        disabled=tree.disable,
        eviction_policy=tree.eviction_policy,
        evictable_size=tree.evictable_size_,
        protected_size=tree.protected_size_,
        nodes=tuple(nodes),
    )


def host_tier_snapshot(
    tree: HostTierView,
    tree_snap: TreeSnapshot | None = None,
    device_snap: AllocatorSnapshot | None = None,
) -> HostTierSnapshot:
    """The whole host tier, as the reference's. ``tree_snap`` / ``device_snap``: the tree's and
    the device allocator's snapshots when the caller just took them (nothing changed since),
    else ``tree.snapshot()`` and the allocator's ``snapshot()``. The device tags of every row are
    one host read where the device pool has one (``_snapshot_tags``), else ``read_tags``."""
    cc = tree.cache_controller
    acks = cc.ack_write_queue + cc.write_queue + cc.ack_load_queue + cc.load_queue
    device_pool = cc.mem_pool_device
    rows = device_pool.num_rows
    released = [int(s) for page in cc.host_mem_release_queue for s in page.tolist()]
    fast = getattr(device_pool, "_snapshot_tags", None)
    if fast is None:
        device_tags = device_pool.read_tags(torch.arange(rows))
    else:
        device_tags = fast(np.arange(rows, dtype=np.int64))
    return HostTierSnapshot(
        write_policy=tree.write_policy,
        device=tree.token_to_kv_pool_allocator.snapshot() if device_snap is None else device_snap,
        tree=tree.snapshot() if tree_snap is None else tree_snap,
        host=tree.token_to_kv_pool_host.snapshot(),
        transfers=tuple(a.snapshot() for a in acks),
        prefetches=tree.storage_prefetch.prefetch_snapshots(),
        release_queue=tuple(released),
        worker_held=tuple(cc.worker_held()),
        device_tags=tuple(device_tags),
    )


__all__ = ["HostTierView", "hi_tree_snapshot", "host_tier_snapshot"]

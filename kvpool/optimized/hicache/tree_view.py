"""Read-only views of the optimized twin's ``HiRadixCache``: the tree snapshot with each node's
host fields, and the snapshot of the whole host tier.

Mirrors :mod:`kvpool.reference.hicache.tree_view` (same fields, same node order); device and
host slots are read out of their int64 tensors as plain integers. Nothing is written.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import torch

from kvpool.optimized.hicache.cache_controller import HiCacheController
from kvpool.optimized.hicache.prefetch import StoragePrefetch
from kvpool.optimized.hicache.tree_node import HiTreeNode, as_hi
from kvpool.optimized.radix.tree_view import TreeViewHost, bfs_nodes, snapshot_tree
from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.protocols.pools import SegmentAllocatorProtocol
from kvpool.snapshot import HostTierSnapshot, TreeSnapshot


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


def hi_tree_snapshot(tree: HostTierView) -> TreeSnapshot:
    """The tree snapshot; nodes carry their host fields (host slots, host pins, a pending
    write)."""
    snap = snapshot_tree(tree)
    by_id = {n.node_id: as_hi(n) for n in bfs_nodes(tree.root_node)}
    nodes = []
    for s in snap.nodes:
        n = by_id[s.node_id]
        host = None if n.host_value is None else tuple(n.host_value.tolist())
        nodes.append(replace(s, evicted=n.evicted, host_value=host,
                             host_ref_counter=n.host_ref_counter,
                             write_pending=n.write_through_pending_id is not None))  # fmt: skip
    return replace(snap, nodes=tuple(nodes))


def host_tier_snapshot(tree: HostTierView) -> HostTierSnapshot:
    """The whole host tier, as the reference's (``tree.snapshot()`` for the tree)."""
    cc = tree.cache_controller
    acks = cc.ack_write_queue + cc.write_queue + cc.ack_load_queue + cc.load_queue
    rows = cc.mem_pool_device.num_rows
    released = [int(s) for page in cc.host_mem_release_queue for s in page.tolist()]
    return HostTierSnapshot(
        write_policy=tree.write_policy,
        device=tree.token_to_kv_pool_allocator.snapshot(),
        tree=tree.snapshot(),
        host=tree.token_to_kv_pool_host.snapshot(),
        transfers=tuple(a.snapshot() for a in acks),
        prefetches=tree.storage_prefetch.prefetch_snapshots(),
        release_queue=tuple(released),
        worker_held=tuple(cc.worker_held()),
        device_tags=tuple(cc.mem_pool_device.read_tags(torch.arange(rows))),
    )


__all__ = ["HostTierView", "hi_tree_snapshot", "host_tier_snapshot"]

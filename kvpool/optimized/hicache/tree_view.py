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
from kvpool.optimized.radix.tree_view import TreeViewHost, snapshot_tree
from kvpool.optimized.radix_key import TreeNode
from kvpool.protocols.hicache import HostPoolProtocol, TaggedKVPoolProtocol
from kvpool.protocols.pools import SegmentAllocatorProtocol
from kvpool.records import filled_record
from kvpool.reference.radix.tree_view import HostFields
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
    def token_to_kv_pool_allocator(self) -> SegmentAllocatorProtocol[torch.Tensor]: ...
    @property
    def token_to_kv_pool_host(self) -> HostPoolProtocol[torch.Tensor]: ...
    @property
    def storage_prefetch(self) -> StoragePrefetch: ...
    @property
    def is_eagle(self) -> bool: ...
    def snapshot(self) -> TreeSnapshot: ...


def hi_tree_snapshot(tree: HostTierView) -> TreeSnapshot:
    """The tree snapshot; nodes carry their host fields (host slots, host pins, a pending
    write): :func:`~kvpool.optimized.radix.tree_view.snapshot_tree` with each node's."""
    return snapshot_tree(tree, _host_fields)


def _host_fields(node: TreeNode) -> HostFields:
    n = as_hi(node)
    value = n.host_value
    host = None if value is None else tuple(value.tolist())
    return (n.evicted, host, n.host_ref_counter, n.write_through_pending_id is not None)


def device_row_tags(device_pool: TaggedKVPoolProtocol[torch.Tensor]) -> list[int]:
    """The tag of every row of ``device_pool`` (``num_rows``): one host read where the pool has
    one (``_snapshot_tags``: the twin's KV pools), else ``read_tags`` of every row."""
    rows = device_pool.num_rows
    fast = getattr(device_pool, "_snapshot_tags", None)
    if fast is None:
        return device_pool.read_tags(torch.arange(rows))
    tags: list[int] = fast(np.arange(rows, dtype=np.int64))
    return tags


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
    released = [int(s) for page in cc.host_mem_release_queue for s in page.tolist()]
    device_tags = device_row_tags(device_pool)
    return filled_record(
        HostTierSnapshot,
        {
            "write_policy": tree.write_policy,
            "device": (
                tree.token_to_kv_pool_allocator.snapshot() if device_snap is None else device_snap
            ),
            "tree": tree.snapshot() if tree_snap is None else tree_snap,
            "host": tree.token_to_kv_pool_host.snapshot(),
            "transfers": tuple([a.snapshot() for a in acks]),
            "prefetches": tree.storage_prefetch.prefetch_snapshots(),
            "release_queue": tuple(released),
            "worker_held": tuple(cc.worker_held()),
            "device_tags": tuple(device_tags),
            "device_held": (),
            "bigram_keys": tree.is_eagle,
        },
    )


__all__ = ["HostTierView", "device_row_tags", "hi_tree_snapshot", "host_tier_snapshot"]

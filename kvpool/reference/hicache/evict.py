"""Eviction in the hierarchical cache: the part of ``HiRadixCache`` that frees device copies
(``evict``, both write policies) and host copies (``evict_host``).

Units: tokens; device slots in ``value``, host slots in ``host_value``. A mixin of
:class:`~kvpool.reference.hicache.hiradix_cache.HiRadixCache` (which provides the tree, the
controller, the locks and ``write_backup`` / ``writing_check``); mirrored in both twins. The rules
are on the cache's module docstring and in specs/host_tier.md.
"""

from __future__ import annotations

import heapq
from typing import Any

from kvpool.errors import InvalidArgumentError
from kvpool.reference.hicache.tree_node import HiTreeNode
from kvpool.reference.radix.tree_view import bfs_nodes
from kvpool.reference.radix_key import TreeNode


def _hi(node: TreeNode | None) -> HiTreeNode:
    """``node`` as a host-tier node (every node of a ``HiRadixCache`` is one)."""
    assert isinstance(node, HiTreeNode)
    return node


class HiRadixEvict:
    """The eviction methods of ``HiRadixCache`` (see the module docstring)."""

    root_node: Any
    disable: bool
    write_policy: str
    priority_fn: Any
    cache_controller: Any
    evictable_size_: int
    ongoing_write_through: dict[int, Any]
    _child_key: Any
    _device_nodes: Any
    write_backup: Any
    writing_check: Any
    unified: bool
    full_host_duplicates: dict[int, HiTreeNode]
    _evict_write_back_unified: Any
    _reclaim_host_duplicates: Any

    def _device_leaves(self) -> list[HiTreeNode]:
        nodes = self._device_nodes()
        return [
            n
            for n in nodes
            if self._device_evictable(n) and all(_hi(c).evicted for c in n.children.values())
        ]

    def _device_evictable(self, node: HiTreeNode) -> bool:
        """Whether ``node``'s device copy may be evicted: no lock (a write-through in flight
        locks its node until its acknowledgement)."""
        return node.lock_ref == 0

    def _make_heap(self, nodes: list[HiTreeNode]) -> list[tuple[Any, HiTreeNode]]:
        heap = [(self.priority_fn(n), n) for n in nodes]
        heapq.heapify(heap)
        return heap

    def _promote_from(self, p: HiTreeNode, heap: list[tuple[Any, HiTreeNode]]) -> None:
        """``p`` lost a device child: push it once every child is host-only."""
        if p is not self.root_node and all(_hi(c).evicted for c in p.children.values()):
            heapq.heappush(heap, (self.priority_fn(p), p))

    def evict(self, num_tokens: int) -> int:
        """Free device copies by policy until ``num_tokens`` tokens are freed (see the module
        docstring); returns the device tokens freed."""
        if num_tokens < 0:
            raise InvalidArgumentError(f"num_tokens must be >= 0, got {num_tokens}")
        if self.disable or num_tokens == 0:
            return 0
        if self.write_policy == "write_back":
            if self.unified:
                return int(self._evict_write_back_unified(num_tokens))
            return self._evict_write_back(num_tokens)
        heap = self._make_heap(self._device_leaves())
        evicted = 0
        while evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if not self._device_evictable(x) or x.evicted or x.parent is None:
                continue
            parent = _hi(x.parent)
            evicted += self._evict_backuped(x) if x.backuped else self._evict_regular(x)
            self._promote_from(parent, heap)
        return evicted

    def _evict_write_back(self, num_tokens: int) -> int:
        heap = self._make_heap(self._device_leaves())
        evicted = 0
        staged: list[tuple[HiTreeNode, list[int]]] = []

        while evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if not self._device_evictable(x) or x.evicted or x.parent is None:
                continue
            parent = _hi(x.parent)
            if x.backuped:
                evicted += self._evict_backuped(x)
            elif self.write_backup(x, write_back=True) > 0:
                x.protect_host()
                staged.append((x, x.value))
                evicted += self._detach_backuped(x)
            else:
                self._flush_staged(staged)
                evicted += self._drop_subtree_no_host(x)
            self._promote_from(parent, heap)
        self._flush_staged(staged)
        return evicted

    def _flush_staged(self, staged: list[tuple[HiTreeNode, list[int]]]) -> None:
        """Write-back eviction: wait for every write in flight (their acknowledgements are
        delivered now), then free the staged nodes' device slots and drop their host pins."""
        if not staged:
            return
        self.writing_check(write_back=True)
        for node, device_indices in staged:
            self.cache_controller.evict_device(device_indices)
            node.release_host()
        staged.clear()

    def _detach_backuped(self, node: HiTreeNode) -> int:
        """Make ``node`` host-only, keeping its device slots for the caller; returns them."""
        n = len(node.value)
        self.evictable_size_ -= n
        node.value = []
        node.evicted = True
        return n

    def _evict_backuped(self, node: HiTreeNode) -> int:
        device_indices = node.value
        n = self._detach_backuped(node)
        self.cache_controller.evict_device(device_indices)
        return n

    def _evict_regular(self, node: HiTreeNode) -> int:
        assert not node.children, f"node {node.node_id} without a backup has children"
        self.cache_controller.evict_device(node.value)
        self._delete(node)
        self.evictable_size_ -= len(node.key)
        return len(node.key)

    def _delete(self, node: HiTreeNode) -> None:
        parent = node.parent
        assert parent is not None
        del parent.children[self._child_key(parent, node.key)]
        node.parent = None
        self.full_host_duplicates.pop(node.node_id, None)

    def _drop_subtree_no_host(self, top: HiTreeNode) -> int:
        """Write-back with a full host: drop ``top`` and its host-only subtree, host and device
        copies, unless some host copy there is pinned (then nothing; returns 0)."""
        nodes = [_hi(n) for n in bfs_nodes(top)]
        if any(n.host_ref_counter > 0 for n in nodes):
            return 0
        freed = 0
        for n in nodes:
            if n.host_value is not None:
                self.cache_controller.evict_host(n.host_value)
                n.host_value = None
            if not n.evicted:
                self.cache_controller.evict_device(n.value)
                freed += len(n.value)
                self.evictable_size_ -= len(n.value)
                n.value = []
                n.evicted = True
            self.ongoing_write_through.pop(n.node_id, None)
        self._delete(top)
        return freed

    def evict_host(self, num_tokens: int) -> int:
        """Free the host copies of unpinned host-only leaves by policy until ``num_tokens``
        host tokens are freed; such a node leaves the tree. Returns the host tokens freed.
        Under the unified write-back rules host duplicates are reclaimed first."""
        if num_tokens < 0:
            raise InvalidArgumentError(f"num_tokens must be >= 0, got {num_tokens}")
        evicted = 0
        if self.unified and self.write_policy == "write_back":
            evicted = int(self._reclaim_host_duplicates(num_tokens))
        leaves = [_hi(n) for n in bfs_nodes(self.root_node)[1:]]
        leaves = [n for n in leaves if n.evicted and not any(
            _hi(c).backuped for c in n.children.values())]  # fmt: skip
        heap = self._make_heap(leaves)
        while evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if not x.evicted or x.host_ref_counter > 0 or x.host_value is None:
                continue
            evicted += self.cache_controller.evict_host(x.host_value)
            parent = _hi(x.parent)
            self._delete(x)
            if not parent.children and parent.evicted:
                heapq.heappush(heap, (self.priority_fn(parent), parent))
        return evicted


__all__ = ["HiRadixEvict"]

"""Eviction in the hierarchical cache: how ``HiRadixCache`` frees device copies (``evict``, both
write policies) and host copies (``evict_host``).

Units: tokens; device slots in ``value``, host slots in ``host_value``. :class:`HostEviction` is
a collaborator the tree owns (``HiRadixCache.host_eviction``); it reaches the tree through
:class:`EvictionTree`, exactly the parts it uses, and the unified host tier's registry of host
duplicates and chain backups through the tree's ``unified_tier``. Mirrored in both twins. The
rules are on the cache's module docstring, in
:mod:`~kvpool.reference.hicache.unified_tier` (SGLang 0.5.23's write-back eviction and reclaim
of host duplicates, here too) and in specs/host_tier.md.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol

from kvpool.host_checks import as_count
from kvpool.reference.hicache.cache_controller import HiCacheController
from kvpool.reference.hicache.tree_node import HiTreeNode, as_hi
from kvpool.reference.hicache.unified_tier import UnifiedHostTier
from kvpool.reference.radix.evict_policy import PriorityKey
from kvpool.reference.radix.tree_view import bfs_nodes, stack_walk
from kvpool.reference.radix_key import ChildKey, RadixKey, TreeNode

Heap = list[tuple[PriorityKey, HiTreeNode]]
"""Eviction candidates keyed by policy (keys end with the node id: nodes never compare)."""


class EvictionTree(Protocol):
    """The parts of ``HiRadixCache`` its eviction uses."""

    evictable_size_: int
    ongoing_write_through: dict[int, tuple[HiTreeNode, list[HiTreeNode]]]

    @property
    def root_node(self) -> HiTreeNode: ...

    @property
    def disable(self) -> bool: ...

    @property
    def write_policy(self) -> str: ...

    @property
    def unified(self) -> bool: ...

    @property
    def priority_fn(self) -> Callable[[HiTreeNode], PriorityKey]: ...

    @property
    def cache_controller(self) -> HiCacheController: ...

    @property
    def unified_tier(self) -> UnifiedHostTier: ...

    def _child_key(self, parent: TreeNode, key: RadixKey) -> ChildKey: ...

    def _device_nodes(self) -> list[HiTreeNode]: ...

    def write_backup(self, node: HiTreeNode, write_back: bool = False) -> int: ...

    def writing_check(self, num_acks: int | None = None, write_back: bool = False) -> int: ...


class HostEviction:
    """The eviction of one ``HiRadixCache`` (see the module docstring)."""

    def __init__(self, tree: EvictionTree) -> None:
        self.tree = tree

    def _device_leaves(self) -> list[HiTreeNode]:
        nodes = self.tree._device_nodes()
        return [
            n
            for n in nodes
            if self._device_evictable(n) and all(as_hi(c).evicted for c in n.children.values())
        ]

    def _device_evictable(self, node: HiTreeNode) -> bool:
        """Whether ``node``'s device copy may be evicted: no lock (a write-through in flight
        locks its node until its acknowledgement)."""
        return node.lock_ref == 0

    def _make_heap(self, nodes: list[HiTreeNode]) -> Heap:
        heap = [(self.tree.priority_fn(n), n) for n in nodes]
        heapq.heapify(heap)
        return heap

    def _promote_from(self, p: HiTreeNode, heap: Heap) -> None:
        """``p`` lost a device child: push it once every child is host-only."""
        if p is not self.tree.root_node and all(as_hi(c).evicted for c in p.children.values()):
            heapq.heappush(heap, (self.tree.priority_fn(p), p))

    def evict(self, num_tokens: int) -> int:
        """Free device copies by policy until ``num_tokens`` tokens are freed (see the module
        docstring); returns the device tokens freed."""
        tree = self.tree
        num_tokens = as_count("num_tokens", num_tokens)
        if tree.disable or num_tokens == 0:
            return 0
        if tree.write_policy == "write_back":
            if tree.unified:
                return self.evict_write_back_unified(num_tokens)
            return self._evict_write_back(num_tokens)
        heap = self._make_heap(self._device_leaves())
        evicted = 0
        while evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if not self._device_evictable(x) or x.evicted or x.parent is None:
                continue
            parent = as_hi(x.parent)
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
            parent = as_hi(x.parent)
            if x.backuped:
                evicted += self._evict_backuped(x)
            elif self.tree.write_backup(x, write_back=True) > 0:
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
        self.tree.writing_check(write_back=True)
        for node, device_indices in staged:
            self.tree.cache_controller.evict_device(device_indices)
            node.release_host()
        staged.clear()

    def _detach_backuped(self, node: HiTreeNode) -> int:
        """Make ``node`` host-only, keeping its device slots for the caller; returns them."""
        n = len(node.value)
        self.tree.evictable_size_ -= n
        node.value = []
        node.evicted = True
        return n

    def _evict_backuped(self, node: HiTreeNode) -> int:
        device_indices = node.value
        n = self._detach_backuped(node)
        self.tree.cache_controller.evict_device(device_indices)
        return n

    def _evict_regular(self, node: HiTreeNode) -> int:
        assert not node.children, f"node {node.node_id} without a backup has children"
        self.tree.cache_controller.evict_device(node.value)
        self._delete(node)
        self.tree.evictable_size_ -= len(node.key)
        return len(node.key)

    def _delete(self, node: HiTreeNode) -> None:
        parent = node.parent
        assert parent is not None
        del parent.children[self.tree._child_key(parent, node.key)]
        node.parent = None
        self.tree.unified_tier.full_host_duplicates.pop(node.node_id, None)

    def _drop_subtree_no_host(self, top: HiTreeNode) -> int:
        """Write-back with a full host: drop ``top`` and its host-only subtree, host and device
        copies, unless some host copy there is pinned (then nothing; returns 0). Node by node
        in stack-walk order (:func:`stack_walk`, as SGLang 0.5.16), each node's host copy
        before its device copy: the order the host slots go back."""
        tree = self.tree
        nodes = [as_hi(n) for n in stack_walk(top)]
        if any(n.host_ref_counter > 0 for n in nodes):
            return 0
        freed = 0
        for n in nodes:
            if n.host_value is not None:
                tree.cache_controller.evict_host(n.host_value)
                n.host_value = None
            if not n.evicted:
                tree.cache_controller.evict_device(n.value)
                freed += len(n.value)
                tree.evictable_size_ -= len(n.value)
                n.value = []
                n.evicted = True
            tree.ongoing_write_through.pop(n.node_id, None)
        self._delete(top)
        return freed

    def evict_host(self, num_tokens: int) -> int:
        """Free the host copies of unpinned host-only leaves by policy until ``num_tokens``
        host tokens are freed; such a node leaves the tree. Returns the host tokens freed.
        Under the unified write-back rules host duplicates are reclaimed first."""
        tree = self.tree
        num_tokens = as_count("num_tokens", num_tokens)
        evicted = 0
        if tree.unified and tree.write_policy == "write_back":
            evicted = self._reclaim_host_duplicates(num_tokens)
        leaves = [as_hi(n) for n in bfs_nodes(tree.root_node)[1:]]
        leaves = [n for n in leaves if n.evicted and not any(
            as_hi(c).backuped for c in n.children.values())]  # fmt: skip
        heap = self._make_heap(leaves)
        while evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if not x.evicted or x.host_ref_counter > 0 or x.host_value is None:
                continue
            evicted += tree.cache_controller.evict_host(x.host_value)
            parent = as_hi(x.parent)
            self._delete(x)
            if not parent.children and parent.evicted:
                heapq.heappush(heap, (tree.priority_fn(parent), parent))
        return evicted

    # ----------------------------------------------------------------- unified host tier
    def _is_device_leaf(self, node: HiTreeNode) -> bool:
        return (
            node is not self.tree.root_node
            and not node.evicted
            and self._device_evictable(node)
            and all(as_hi(c).evicted for c in node.children.values())
        )

    def _reclaim_host_duplicates(self, num_tokens: int) -> int:
        """Unified write-back: free the host copies of registered duplicates in registry order
        until ``num_tokens`` host tokens are freed (see
        :mod:`~kvpool.reference.hicache.unified_tier`); returns them."""
        registry = self.tree.unified_tier.full_host_duplicates
        freed = 0
        swept: list[int] = []
        for spare_leaves in (True, False):
            if freed >= num_tokens:
                break
            for node in list(registry.values()):
                if freed >= num_tokens:
                    break
                if node.evicted or node.host_value is None:
                    swept.append(node.node_id)  # stale entry
                    continue
                if spare_leaves and self._is_device_leaf(node):
                    continue
                if (
                    node.write_through_pending_id is not None
                    or node.load_back_pending_id is not None
                    or node.host_ref_counter > 0
                ):
                    continue
                freed += self.tree.cache_controller.evict_host(node.host_value)
                node.host_value = None
                swept.append(node.node_id)
        for node_id in swept:
            registry.pop(node_id, None)
        return freed

    def evict_write_back_unified(self, num_tokens: int) -> int:
        """Unified write-back eviction leaf by leaf (see
        :mod:`~kvpool.reference.hicache.unified_tier`); returns the device tokens freed.
        InvalidArgumentError unless ``num_tokens`` is a count."""
        tree = self.tree
        num_tokens = as_count("num_tokens", num_tokens)
        heap = self._make_heap(self._device_leaves())
        evicted = 0
        while evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if not self._device_evictable(x) or x.evicted or x.parent is None:
                continue
            parent = as_hi(x.parent)
            if x.host_value is not None:
                evicted += self._evict_backuped(x)
            elif tree.unified_tier.backup_chain(x, write_back=True) > 0:
                tree.writing_check(write_back=True)
                evicted += self._evict_backuped(x)
            else:
                evicted += self._drop_subtree_unified(x)
            self._promote_from(parent, heap)
        tree.writing_check(write_back=True)
        return evicted

    def _drop_subtree_unified(self, top: HiTreeNode) -> int:
        """Write-back with no host room: drop the unbacked device leaf ``top`` and its host-only
        subtree unless a node there is locked, pinned or has a transfer in flight (then
        nothing; returns 0). The device slots are freed first, then the host copies in reverse
        depth-first order (children popped from the end). Returns the device tokens freed."""
        tree = self.tree
        registry = tree.unified_tier.full_host_duplicates
        nodes = [as_hi(n) for n in stack_walk(top)]  # top first
        for n in nodes:
            if (
                n.lock_ref > 0
                or n.host_ref_counter > 0
                or n.write_through_pending_id is not None
                or n.load_back_pending_id is not None
            ):
                return 0
        freed = int(tree.cache_controller.evict_device(top.value))
        tree.evictable_size_ -= freed
        for n in reversed(nodes[1:]):
            assert n.evicted and n.host_value is not None, f"node {n.node_id} not host-only"
            tree.cache_controller.evict_host(n.host_value)
            n.host_value = None
            registry.pop(n.node_id, None)
            self._delete(n)
        top.value = []
        top.evicted = True
        registry.pop(top.node_id, None)
        self._delete(top)
        return freed


__all__ = ["EvictionTree", "HostEviction"]

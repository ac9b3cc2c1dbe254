"""``SWARadixEviction``: eviction of the SWA radix cache, a mixin of
:class:`kvpool.reference.swa.radix_cache.SWARadixCache`.

Full eviction deletes least-recently-used unlocked leaves (and tombstone parents left as
unlocked leaves); SWA eviction takes least-recently-used non-tombstone nodes without an SWA lock:
an internal node, or a leaf whose full part is still locked, only loses its SWA slots
(tombstone); an unlocked leaf is deleted. Least recently used: smallest
``(last_access_time, depth, node_id)`` (rules: :mod:`kvpool.reference.swa.radix_cache`).
"""

from __future__ import annotations

from kvpool.errors import InvalidArgumentError
from kvpool.reference.radix_key import ChildKey, RadixKey
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.reference.swa.tree_node import SWATreeNode


class SWARadixEviction:
    """``evict(num_tokens, swa_num_tokens)`` and its helpers (module docstring)."""

    root_node: SWATreeNode
    token_to_kv_pool_allocator: SWATokenToKVPoolAllocator
    full_evictable_size_: int
    swa_evictable_size_: int

    def _child_key(self, parent: SWATreeNode, key: RadixKey) -> ChildKey:
        raise NotImplementedError

    def _nodes(self) -> list[SWATreeNode]:
        out, stack = [], list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    @staticmethod
    def _lru(nodes: list[SWATreeNode]) -> SWATreeNode | None:
        return min(nodes, key=lambda n: (n.last_access_time, n.depth(), n.node_id), default=None)

    def _delete_leaf(self, node: SWATreeNode) -> None:
        parent = node.parent
        assert parent is not None
        del parent.children[self._child_key(parent, node.key)]
        node.parent = None
        self.full_evictable_size_ -= len(node.value)
        if not node.swa_tombstone:
            self.swa_evictable_size_ -= len(node.value)

    def _delete_tombstone_parents(self, parent: SWATreeNode) -> int:
        """Delete tombstones left as unlocked leaves above a deleted leaf; full tokens freed."""
        freed = 0
        while (parent is not self.root_node and parent.swa_tombstone and not parent.children
               and parent.full_lock_ref == 0):  # fmt: skip
            up = parent.parent
            assert up is not None
            self.token_to_kv_pool_allocator.free(parent.value)
            freed += len(parent.value)
            self._delete_leaf(parent)
            parent = up
        return freed

    @staticmethod
    def _swa_evictable(node: SWATreeNode) -> bool:
        """SWA eviction may take it: it holds SWA slots nobody's window reads."""
        return not node.swa_tombstone and node.swa_lock_ref == 0

    @staticmethod
    def _keeps_full(node: SWATreeNode) -> bool:
        """SWA eviction only tombstones it: its full part has children or a running request."""
        return bool(node.children) or node.full_lock_ref > 0

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]:
        """Free at least ``num_tokens`` full and ``swa_num_tokens`` SWA tokens if the tree
        allows (module docstring); returns (full tokens freed, SWA tokens freed)."""
        if num_tokens < 0 or swa_num_tokens < 0:
            raise InvalidArgumentError("eviction sizes must be >= 0")
        alloc = self.token_to_kv_pool_allocator
        full = swa = 0
        while num_tokens > 0 and full < num_tokens:
            x = self._lru([n for n in self._nodes() if not n.children and n.full_lock_ref == 0])
            if x is None:
                break
            parent = x.parent
            assert parent is not None
            alloc.free(x.value)
            full += len(x.value)
            swa += 0 if x.swa_tombstone else len(x.value)
            self._delete_leaf(x)
            full += self._delete_tombstone_parents(parent)
        while swa < swa_num_tokens:
            x = self._lru([n for n in self._nodes() if self._swa_evictable(n)])
            if x is None:
                break
            swa += len(x.value)
            if self._keeps_full(x):
                alloc.free_swa(x.value)  # the full part stays (children, or a running request)
                x.swa_tombstone = True
                self.swa_evictable_size_ -= len(x.value)
                continue
            parent = x.parent
            assert parent is not None
            alloc.free(x.value)
            full += len(x.value)
            self._delete_leaf(x)
            self._delete_tombstone_parents(parent)
        return full, swa


__all__ = ["SWARadixEviction"]

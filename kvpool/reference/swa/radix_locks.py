"""``SWARadixLocks``: the full and SWA lock counts of the SWA radix cache, a mixin of
:class:`kvpool.reference.swa.radix_cache.SWARadixCache`.

A request full-locks its node and every ancestor (``full_lock_ref``) and SWA-locks them from
its node upwards only until ``sliding_window_size`` tokens are covered (``swa_lock_ref``); the
node where that happens gets an ``swa_uuid`` that the unlock stops at. ``dec_swa_lock_only``
releases the SWA part alone (a leaf left without SWA lock is tombstoned at once). Sizes move
between evictable and protected as the counts leave or reach 0. Invalid locks raise LockError
and change nothing (rules: :mod:`kvpool.reference.swa.radix_cache`).
"""

from __future__ import annotations

from kvpool.errors import LockError
from kvpool.reference.radix_key import ChildKey, RadixKey
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.reference.swa.tree_node import SWATreeNode


class SWARadixLocks:
    """``inc_lock_ref``, ``dec_lock_ref`` and ``dec_swa_lock_only`` (module docstring)."""

    root_node: SWATreeNode
    token_to_kv_pool_allocator: SWATokenToKVPoolAllocator
    sliding_window_size: int
    full_evictable_size_: int
    full_protected_size_: int
    swa_evictable_size_: int
    swa_protected_size_: int
    _next_uuid: int

    def _child_key(self, parent: SWATreeNode, key: RadixKey) -> ChildKey:
        raise NotImplementedError

    def _path_to_root(self, node: SWATreeNode) -> list[SWATreeNode]:
        path, cur = [], node
        while cur is not self.root_node:
            parent = cur.parent
            if parent is None or parent.children.get(self._child_key(parent, cur.key)) is not cur:
                raise LockError(f"node {node.node_id} is not in the tree")
            path.append(cur)
            cur = parent
        return path

    def inc_lock_ref(self, node: SWATreeNode) -> int | None:
        """Full-lock ``node`` -> root and SWA-lock from ``node`` up until the window is covered;
        returns the swa_uuid of the node where it was (None: the whole path). LockError if the
        window would cover a tombstone."""
        path = self._path_to_root(node)
        covered, swa_part = 0, []
        for cur in path:
            if covered >= self.sliding_window_size:
                break
            swa_part.append(cur)
            covered += len(cur.value)
        if any(cur.swa_tombstone for cur in swa_part):
            raise LockError(f"the window of node {node.node_id} covers a tombstone")
        for cur in path:
            if cur.full_lock_ref == 0:
                self.full_evictable_size_ -= len(cur.value)
                self.full_protected_size_ += len(cur.value)
            cur.full_lock_ref += 1
        uuid = None
        for cur in swa_part:
            if cur.swa_lock_ref == 0:
                self.swa_evictable_size_ -= len(cur.value)
                self.swa_protected_size_ += len(cur.value)
            cur.swa_lock_ref += 1
        if swa_part and sum(len(c.value) for c in swa_part) >= self.sliding_window_size:
            last = swa_part[-1]
            if last.swa_uuid is None:
                self._next_uuid += 1
                last.swa_uuid = self._next_uuid
            uuid = last.swa_uuid
        return uuid

    def _swa_part(self, path: list[SWATreeNode], uuid: int | None) -> list[SWATreeNode]:
        """The nodes an SWA unlock walks: up to and including the one carrying ``uuid``."""
        for i, cur in enumerate(path):
            if uuid is not None and cur.swa_uuid == uuid:
                return path[: i + 1]
        return path

    def _check_swa_unlock(self, part: list[SWATreeNode]) -> None:
        bad = [c.node_id for c in part if c.swa_tombstone or c.swa_lock_ref <= 0]
        if bad:
            raise LockError(f"no SWA lock to release on nodes {bad}")

    def dec_lock_ref(self, node: SWATreeNode, swa_uuid_for_lock: int | None = None,
                     skip_swa: bool = False) -> None:  # fmt: skip
        """Undo :meth:`inc_lock_ref` (``skip_swa``: its SWA part was released already).
        LockError (nothing changed) if a count would go negative."""
        path = self._path_to_root(node)
        if any(c.full_lock_ref <= 0 for c in path):
            raise LockError(f"full lock_ref would go negative above node {node.node_id}")
        part = [] if skip_swa else self._swa_part(path, swa_uuid_for_lock)
        self._check_swa_unlock(part)
        for cur in path:
            if cur.full_lock_ref == 1:
                self.full_evictable_size_ += len(cur.value)
                self.full_protected_size_ -= len(cur.value)
            cur.full_lock_ref -= 1
        for cur in part:
            if cur.swa_lock_ref == 1:
                self.swa_evictable_size_ += len(cur.value)
                self.swa_protected_size_ -= len(cur.value)
            cur.swa_lock_ref -= 1

    def dec_swa_lock_only(self, node: SWATreeNode, swa_uuid_for_lock: int | None = None) -> None:
        """Release only the SWA part of a lock (the window moved on); a leaf left without SWA
        lock loses its SWA slots at once (tombstone). LockError (nothing changed) if absent."""
        part = self._swa_part(self._path_to_root(node), swa_uuid_for_lock)
        self._check_swa_unlock(part)
        for cur in part:
            if cur.swa_lock_ref == 1:
                self.swa_protected_size_ -= len(cur.value)
                if not cur.children:
                    self.token_to_kv_pool_allocator.free_swa(cur.value)
                    cur.swa_tombstone = True
                else:
                    self.swa_evictable_size_ += len(cur.value)
            cur.swa_lock_ref -= 1


__all__ = ["SWARadixLocks"]

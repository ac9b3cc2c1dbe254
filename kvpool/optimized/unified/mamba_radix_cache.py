"""``UnifiedMambaRadixCache`` (optimized twin): SGLang 0.5.23's FULL + MAMBA unified tree.

Mirrors :mod:`kvpool.reference.unified.mamba_radix_cache` (same API, results, errors, node ids
and LRU orders) over the twin's :class:`MambaRadixCache` (KV values as device tensors, freed one
tensor per call). The reference's docstring, repeated here, states 0.5.23's rules:

SGLang 0.5.23 builds one ``UnifiedRadixCache(tree_components=(FULL, MAMBA))`` for a hybrid SSM
model (specs/unified_cache.md). Its tree makes the decisions kvpool's :class:`MambaRadixCache`
states (SGLang 0.5.16's Mamba tree: the same splits and node ids, the prefix up to the deepest
node with a state, copy-on-write with one state evicted when no slot is free, KV in least
recently used order, states in their own order, a leaf evicted whole), except where 0.5.23
differs; this class adds those differences (found by running both against each other,
``kvpool verify --sglang 0.5.23 --component unified_mamba_radix_cache``):

- **A node whose state was evicted keeps its KV, at the bottom of the tree too.** Evicting a
  leaf (for KV or for a state) frees that leaf only; its parent, left childless without a
  state, stays as a *tombstone leaf* holding its KV, evictable later as any leaf (0.5.16
  deleted such parents at once, so no leaf was a tombstone).
- **One eviction, two amounts.** ``evict(num_tokens, mamba_num)`` evicts KV leaves until
  ``num_tokens`` tokens are freed, then states until ``mamba_num`` states are freed, counting
  what either walk freed: the states of the leaves the KV walk evicted count towards
  ``mamba_num`` (and the tokens of the leaves the state walk evicted are reported with the
  KV walk's). It returns both totals. (0.5.16 ran the two walks apart and counted each its
  own.)
- **An insert that finds the state cached refreshes it.** When the end node already holds a
  state (``mamba_exist``), that state becomes the most recently used in the state order
  (0.5.16 refreshed only the KV order there).
- **The Mamba lock counts its anchor node, tombstone or not.** ``inc_lock_ref(node)`` always
  raises ``node.mamba_lock_ref`` (the sizes move only for a node holding a state), so a lock
  taken on a tombstone is undone by its unlock, and a state stored on a locked tombstone is
  protected (0.5.16 locked only a node holding a state, at the lock and again at the unlock).
- **The tree frees through ``free_segment``** (the insert's duplicates and evicted KV), as the
  FULL set does (:class:`~kvpool.reference.unified.radix_cache.UnifiedRadixCache`); at page
  size 1 that frees the same slots in the same order as ``free`` (``_free_kv``; the lifecycle's
  0.5.16 tree, ``UnifiedMambaLifecycleCacheV0516``, frees with ``free``).

The FULL set's other difference (a split keeps the creation time) decides nothing here: the
Mamba tree evicts in least-recently-used order only. Units: tokens and token slots for
``full_*``, states (Mamba slots) for ``mamba_*``; page size 1.

**SGLang 0.5.16's unified tree.** 0.5.16 builds an earlier ``UnifiedRadixCache`` for a hybrid
model with the radix cache on (``kvpool verify --sglang 0.5.16 --component
unified_mamba_radix_cache``). It behaves as above except in two places, each the ``Rules`` knob
its FULL+SWA set has too (defaults: 0.5.23; ``Rules.for_sglang("0.5.16")``: 0.5.16):

- ``unified_tombstone_lock="skip"``: **a Mamba lock skips a tombstone anchor.** ``inc_lock_ref``
  on a node without a state takes the KV locks of its path only; the lock's receipt records the
  skip, and its unlock takes the KV locks back only (SGLang's ``skip_lock_node_ids``). An unlock
  of a node whose state lock is 0 changes no state count, so a state stored later on a tombstone
  locked that way is evictable (and an evictable state on a KV-locked leaf is evicted as on an
  inner node: the node keeps its KV as a tombstone). kvpool keeps the receipts as a count of
  open skipped locks per node and undoes a counted lock first: no lock is skipped while a
  counted one is open on the node (a counted lock pins the state), so this is the newest
  receipt's release, SGLang's order. An unlock with neither open is a LockError (misuse).
- ``unified_split_recency="front"``: **a split refreshes the cut node's state.** The lower half
  (the node cut, which keeps the state) moves to the front of the state order (0.5.16's
  ``_split_node`` reinserts it; 0.5.23 keeps its place).
"""

from __future__ import annotations

import torch

from kvpool.errors import LockError
from kvpool.host_checks import as_count
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.optimized.mamba.radix_cache import MambaRadixCache
from kvpool.optimized.mamba.tree_node import MambaTreeNode
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.optimized.radix_key import RadixKey
from kvpool.rules import Rules


class UnifiedMambaRadixCache(MambaRadixCache):
    """:class:`MambaRadixCache` under SGLang 0.5.23's rules (module docstring)."""

    frees_duplicates = True
    """Callers read this: an insert frees the caller's duplicate KV slots itself."""

    def __init__(
        self,
        req_to_token_pool: HybridReqToTokenPool,
        token_to_kv_pool_allocator: BaseTokenToKVPoolAllocator,
        page_size: int = 1,
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
    ) -> None:
        self.rules = rules if rules is not None else Rules()
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size,
                         options=options)  # fmt: skip

    def reset(self) -> None:
        """:meth:`MambaRadixCache.reset`; no lock is open."""
        super().reset()
        self._skipped_locks: dict[int, int] = {}
        """``unified_tombstone_lock "skip"``: node id -> its open locks that skipped the state
        lock (their receipts)."""

    def _skips_tombstones(self, node: MambaTreeNode) -> bool:
        """Whether a lock on ``node`` leaves the state lock alone (0.5.16 on a tombstone or the
        root; 0.5.23 counts every anchor)."""
        return self.rules.unified_tombstone_lock == "skip" and (
            node is self.root_node or node.mamba_value is None
        )

    def _split_node(self, child: MambaTreeNode, split_len: int) -> MambaTreeNode:
        """:meth:`MambaRadixCache._split_node`; under ``unified_split_recency "front"`` the cut
        node's state (if any) becomes the most recently used."""
        upper = super()._split_node(child, split_len)
        if self.rules.unified_split_recency == "front" and child.mamba_value is not None:
            self.mamba_lru_list.reset_node_mru(child)
        return upper

    def _free_kv(self, slots: torch.Tensor) -> None:
        """Free KV slots the tree lets go (an insert's duplicates, an evicted leaf's KV): one
        ``free_segment`` (0.5.23; at page size 1 the slots and order of one ``free``). The
        lifecycle's 0.5.16 tree frees them with ``free``, as 0.5.16's cache does."""
        self.token_to_kv_pool_allocator.free_segment(slots, 0)

    def _free_duplicates(self, slots: torch.Tensor) -> None:
        self._free_kv(slots)

    # ----------------------------------------------------------------- insert
    def _insert(
        self, key: RadixKey, value: torch.Tensor, mamba_value: int, prev_prefix_len: int
    ) -> tuple[int, bool]:
        """:meth:`MambaRadixCache.insert` (its checks, then this); a state stored on a locked
        tombstone is protected, and a state found already cached becomes the most recently
        used."""
        end = self._end_node(key)
        locked = end is not None and end.mamba_value is None and end.mamba_lock_ref > 0
        cached, exist = super()._insert(key, value, mamba_value, prev_prefix_len)
        if locked and not exist:
            self.mamba_evictable_size_ -= 1
            self.mamba_protected_size_ += 1
        if exist and end is not None:
            self.mamba_lru_list.reset_node_mru(end)
        return cached, exist

    def _end_node(self, key: RadixKey) -> MambaTreeNode | None:
        """The node an insert of ``key`` would end on without a split or a new leaf, if any."""
        node, rest = self.root_node, key
        while len(rest):
            child = node.children.get(self._child_key(node, rest))
            if child is None or len(child.key) > len(rest):
                return None
            if self._match_len(child.key, rest) < len(child.key):
                return None
            node, rest = child, rest[len(child.key) :]
        return None if node is self.root_node else node

    # ----------------------------------------------------------------- locks
    def inc_lock_ref(self, node: MambaTreeNode) -> None:
        """Lock the KV of ``node``'s path to the root and ``node``'s own state lock (counted
        even on a tombstone; the sizes move only for a node holding a state). Under
        ``unified_tombstone_lock "skip"`` a node without a state (the root too) gets no state
        lock: the skip is recorded for the unlock."""
        path = self._path(node)
        if self._skips_tombstones(node):
            self._skipped_locks[node.node_id] = self._skipped_locks.get(node.node_id, 0) + 1
        else:
            if node.mamba_lock_ref == 0 and node.mamba_value is not None:
                self.mamba_evictable_size_ -= 1
                self.mamba_protected_size_ += 1
            node.mamba_lock_ref += 1
        for cur in path:
            if cur.full_lock_ref == 0:
                self.full_evictable_size_ -= len(cur.value)
                self.full_protected_size_ += len(cur.value)
            cur.full_lock_ref += 1

    def dec_lock_ref(self, node: MambaTreeNode) -> None:
        """Undo :meth:`inc_lock_ref` (under ``unified_tombstone_lock "skip"``: a counted lock
        first, else a skipped one, which gives back the KV locks only); LockError (nothing
        changed) if a count would go negative or no lock is open on the node."""
        path = self._check_unlock(node)
        skipped = self._skipped_locks.get(node.node_id, 0)
        counted = node.mamba_lock_ref > 0 and node is not self.root_node
        if self.rules.unified_tombstone_lock == "skip" and not counted:
            self._skipped_locks[node.node_id] = skipped - 1
        else:
            if node.mamba_lock_ref == 1 and node.mamba_value is not None:
                self.mamba_evictable_size_ += 1
                self.mamba_protected_size_ -= 1
            node.mamba_lock_ref -= 1
        for cur in path:
            if cur.full_lock_ref == 1:
                self.full_evictable_size_ += len(cur.value)
                self.full_protected_size_ -= len(cur.value)
            cur.full_lock_ref -= 1

    def _check_unlock(self, node: MambaTreeNode) -> list[MambaTreeNode]:
        """The path :meth:`dec_lock_ref` would unlock, after its checks (nothing changes)."""
        path = self._path(node)
        skipped = self._skipped_locks.get(node.node_id, 0)
        counted = node.mamba_lock_ref > 0 and node is not self.root_node
        if self.rules.unified_tombstone_lock == "skip" and not counted and skipped <= 0:
            raise LockError(f"no lock is open on node {node.node_id}")
        if self.rules.unified_tombstone_lock == "count" and node.mamba_lock_ref <= 0:
            raise LockError(f"mamba_lock_ref would go negative on node {node.node_id}")
        bad = [cur.node_id for cur in path if cur.full_lock_ref <= 0]
        if bad:
            raise LockError(f"full_lock_ref would go negative on nodes {bad}")
        return path

    # ----------------------------------------------------------------- eviction
    def _evict_leaf(self, leaf: MambaTreeNode) -> tuple[int, int]:
        """Free a whole unlocked leaf (its KV, and its state unless it is a tombstone); the
        parent stays, whatever it holds. Returns ``(tokens, states)`` freed."""
        assert not leaf.children and leaf.full_lock_ref == 0 and leaf.mamba_lock_ref == 0
        self._free_kv(leaf.value)
        states = 0
        if leaf.mamba_value is not None:
            self.req_to_token_pool.mamba_allocator.free([leaf.mamba_value])
            self.mamba_lru_list.remove(leaf)
            self.mamba_evictable_size_ -= 1
            states = 1
        self.full_lru_list.remove(leaf)
        self._detach(leaf)
        return len(leaf.value), states

    def _evict_state(self, node: MambaTreeNode) -> None:
        """Free the state of an inner node (or of a KV-locked leaf): it becomes a tombstone."""
        assert node.mamba_value is not None and node.mamba_lock_ref == 0
        self.req_to_token_pool.mamba_allocator.free([node.mamba_value])
        self.mamba_lru_list.remove(node)
        node.mamba_value = None
        self.mamba_evictable_size_ -= 1

    def evict(self, num_tokens: int = 0, mamba_num: int = 0) -> tuple[int, int]:
        """Evict unlocked KV leaves, least recently used first, until ``num_tokens`` tokens are
        freed, then unlocked states, least recently used first (an inner node becomes a
        tombstone, a leaf goes whole), until ``mamba_num`` states are freed, each walk counting
        what both freed; returns ``(tokens, states)`` freed. InvalidArgumentError (nothing
        changed) for an amount that is not an int >= 0."""
        num_tokens = as_count("num_tokens", num_tokens)
        mamba_num = as_count("mamba_num", mamba_num)
        tokens = states = 0
        while tokens < num_tokens:
            leaf = self.full_lru_list.lru_no_lock(leaf_only=True)
            if leaf is None:
                break
            freed, gone = self._evict_leaf(leaf)
            tokens, states = tokens + freed, states + gone
        while states < mamba_num:
            node = self.mamba_lru_list.lru_no_lock()
            if node is None:
                break
            if node.children or node.full_lock_ref > 0:  # an inner node, or a leaf whose
                self._evict_state(node)  # KV a lock that skipped its state pins (0.5.16)
                states += 1
            else:
                freed, gone = self._evict_leaf(node)
                tokens, states = tokens + freed, states + gone
        return tokens, states

    def evict_mamba(self, mamba_num: int) -> int:
        """:meth:`evict` of ``mamba_num`` states (an int >= 0: InvalidArgumentError otherwise);
        returns the states freed."""
        return self.evict(0, as_count("mamba_num", mamba_num))[1]

    def evict_full(self, full_num_tokens: int) -> int:
        """:meth:`evict` of ``full_num_tokens`` tokens (an int >= 0: InvalidArgumentError
        otherwise); returns the tokens freed."""
        return self.evict(as_count("full_num_tokens", full_num_tokens), 0)[0]


__all__ = ["UnifiedMambaRadixCache"]

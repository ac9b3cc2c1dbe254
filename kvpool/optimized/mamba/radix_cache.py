"""``MambaRadixCache`` (optimized twin): the hybrid prefix tree, KV values as device tensors.

Same API, results, errors, node ids and LRU orders as :mod:`kvpool.reference.mamba.radix_cache`
(read its docstring for SGLang's rules). Node values are int64 slot tensors on the device: a
match concatenates the path's values once, a split slices (and copies) one value, and every
free hands the allocator one tensor. Keys are the twin's :class:`RadixKey` (host token ids,
compared as numpy arrays); state slots are host ints, as in the twin's hybrid pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    LockError,
    ReservedIndexError,
)
from kvpool.host_checks import as_bool, as_count, as_int
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.optimized.mamba.tree_node import LRUList, MambaTreeNode
from kvpool.optimized.options import TwinOptions, options_of
from kvpool.optimized.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.optimized.pools.paged_ops import check_free_slots
from kvpool.optimized.radix_key import RadixKey, check_tree_range
from kvpool.protocols.requests import MambaReqLike
from kvpool.records import filled_record
from kvpool.reference.mamba.hybrid_req_to_token_pool import MAMBA_FIELDS, check_mamba_req
from kvpool.reference.radix_key import ChildKey, tree_slot_limit
from kvpool.snapshot import MambaNodeSnapshot, MambaTreeSnapshot

_SHORT_KEY = 48
"""Keys up to this many tokens are compared in Python (measured: benchmarks/bench_mamba.py)."""


@dataclass
class MambaMatchResult:
    """``device_indices``: KV slots of the prefix up to the deepest node with a state;
    ``last_device_node``: that node (the root when none); ``cow_staged``: whether the request
    was given a slot and a copy to make."""

    device_indices: torch.Tensor
    last_device_node: MambaTreeNode
    cow_staged: bool = False


class MambaRadixCache:
    """Prefix cache over the hybrid pool's Mamba slots and the allocator's token slots.
    ``options``: the twin's :class:`~kvpool.optimized.options.TwinOptions`; a tree built alone
    over collaborators and given none runs as its allocator does (:func:`~kvpool.optimized.options.
    options_of`)."""

    def __init__(
        self,
        req_to_token_pool: HybridReqToTokenPool,
        token_to_kv_pool_allocator: BaseTokenToKVPoolAllocator,
        page_size: int = 1,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        if page_size != 1 or token_to_kv_pool_allocator.page_size != 1:
            raise ConfigError(f"the Mamba radix cache needs page size 1, got {page_size}")
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.options = options if options is not None else options_of(token_to_kv_pool_allocator)
        self.device = self.options.device
        self.reset()

    def reset(self) -> None:
        """Forget the tree (frees nothing); node ids restart at 0 (the root, locked forever)."""
        self._next_id = 0
        self.root_node = self._new_node(RadixKey([]), self._empty(), None)
        self.root_node.full_lock_ref = self.root_node.mamba_lock_ref = 1
        self.full_evictable_size_ = self.mamba_evictable_size_ = 0
        self.full_protected_size_ = self.mamba_protected_size_ = 0
        self.full_lru_list: LRUList[MambaTreeNode] = LRUList(mamba=False)
        self.mamba_lru_list: LRUList[MambaTreeNode] = LRUList(mamba=True)

    def _empty(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)

    def _new_node(
        self,
        key: RadixKey,
        value: torch.Tensor,
        parent: MambaTreeNode | None,
        mamba: int | None = None,
    ) -> MambaTreeNode:
        node = MambaTreeNode(self._next_id, key, value, parent, mamba)
        self._next_id += 1
        return node

    def _child_key(self, parent: MambaTreeNode, key: RadixKey) -> ChildKey:
        plain = key.plain_child_key(1)
        return (key.extra_key, plain) if parent is self.root_node else plain

    @staticmethod
    def _match_len(a: RadixKey, b: RadixKey) -> int:
        limit = min(len(a), len(b))
        if limit <= _SHORT_KEY:  # a Python scan beats numpy's fixed cost on short keys
            x, y, n = a.token_ids, b.token_ids, 0
            while n < limit and x[n] == y[n]:
                n += 1
            return n
        differ = np.flatnonzero(a.array[:limit] != b.array[:limit])
        return int(differ[0]) if differ.size else limit

    # ----------------------------------------------------------------- sizes
    def full_evictable_size(self) -> int:
        return self.full_evictable_size_

    def mamba_evictable_size(self) -> int:
        return self.mamba_evictable_size_

    def full_protected_size(self) -> int:
        return self.full_protected_size_

    def mamba_protected_size(self) -> int:
        return self.mamba_protected_size_

    def all_mamba_values(self) -> list[int]:
        """Every cached state's slot (the scheduler's leak check counts them)."""
        return [n.mamba_value for n in self._nodes() if n.mamba_value is not None]

    def _nodes(self) -> list[MambaTreeNode]:
        out, stack = [], [self.root_node]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children.values()))
        return out

    # ----------------------------------------------------------------- match / insert
    def _split_node(self, child: MambaTreeNode, split_len: int) -> MambaTreeNode:
        """Cut ``child`` after ``split_len`` tokens: a new upper node (a tombstone, the child's
        KV lock count) takes the first part; the child, more recent in the KV order, the rest."""
        parent = child.parent
        assert parent is not None
        dict_key = self._child_key(parent, child.key)
        upper = self._new_node(child.key[:split_len], child.value[:split_len].clone(), parent)
        upper.full_lock_ref = child.full_lock_ref
        child.key, child.value = child.key[split_len:], child.value[split_len:].clone()
        child.parent = upper
        upper.children[self._child_key(upper, child.key)] = child
        parent.children[dict_key] = upper
        self.full_lru_list.remove(child)
        self.full_lru_list.insert_mru(upper)
        self.full_lru_list.insert_mru(child)
        return upper

    def _walk(self, key: RadixKey) -> tuple[list[torch.Tensor], MambaTreeNode, int]:
        """Match ``key`` (splitting at the end); the matched slots, the deepest node with a
        state on the path and how many of the slots lead to it."""
        node: MambaTreeNode = self.root_node
        value: list[torch.Tensor] = []
        best, best_len = node, 0
        while len(key) and self._child_key(node, key) in node.children:
            child = node.children[self._child_key(node, key)]
            if node.mamba_value is not None:
                best, best_len = node, len(value)  # nodes, not tokens: values are tensors
            n = self._match_len(child.key, key)
            if n < len(child.key):
                node = self._split_node(child, n)
                value.append(node.value)
                break
            value.append(child.value)
            node, key = child, key[n:]
        if node.mamba_value is not None:
            best, best_len = node, len(value)
        return value, best, best_len

    # ----------------------------------------------------------------- argument checks
    @staticmethod
    def _check_key(key: object) -> RadixKey:
        if not isinstance(key, RadixKey):
            raise InvalidArgumentError(f"key must be a RadixKey, got {key!r}")
        return key

    def _check_state_slot(self, name: str, slot: object) -> int:
        """A Mamba slot the caller holds (host values, both modes; see the reference)."""
        value = as_int(name, slot)
        alloc = self.req_to_token_pool.mamba_allocator
        if value == RESERVED_INDEX:
            raise ReservedIndexError(f"{name}: Mamba slot {RESERVED_INDEX} is reserved")
        if not RESERVED_INDEX < value <= alloc.size:
            raise IndexOutOfRangeError(f"{name}: Mamba slot {value} outside 1..{alloc.size}")
        if alloc._is_free[value] or value in (alloc._group or ()):
            raise DoubleFreeError(f"{name}: Mamba slot {value} is free, not the caller's", [value])
        return value

    def _check_held_kv(self, name: str, slots: torch.Tensor) -> None:
        """Checked mode (a device read): KV slots the caller hands to the tree are held (not
        free in the allocator) and named once (DoubleFreeError)."""
        free_mask = getattr(self.token_to_kv_pool_allocator, "_free_mask", None)
        if self.options.checked and free_mask is not None and slots.numel():
            try:
                check_free_slots(slots, free_mask, 1, True)
            except DoubleFreeError as exc:
                raise DoubleFreeError(f"{name}: KV free or named twice", exc.indices) from None

    def _check_slots(self, name: str, value: object) -> torch.Tensor:
        """A node's future slots: a 1-D integer index (both modes); each in range and not
        slot 0 for a host sequence always, for a tensor in checked mode (a device read)."""
        slots = index_tensor(name, value, self.device)
        if self.options.checked or not isinstance(value, torch.Tensor):
            check_tree_range(slots, tree_slot_limit(self.token_to_kv_pool_allocator))
        return slots

    def _check_insert(
        self, key: object, value: object, mamba_value: object, prev_prefix_len: object
    ) -> tuple[RadixKey, torch.Tensor, int, int]:
        """:meth:`insert`'s arguments checked before any change (see the reference)."""
        key = self._check_key(key)
        slots = self._check_slots("value", value)
        if len(slots) != len(key):
            raise InvalidArgumentError(f"value: {len(slots)} slots for {len(key)} tokens")
        prev = as_count("prev_prefix_len", prev_prefix_len)
        if prev > len(key):
            raise InvalidArgumentError(f"prev_prefix_len {prev} past the key's {len(key)} tokens")
        state = self._check_state_slot("mamba_value", mamba_value)
        if self.options.checked and state in self._cached_states():
            raise InvalidArgumentError(f"mamba_value: Mamba slot {state} is cached by the tree")
        self._check_held_kv("value", slots[prev:])
        return key, slots, state, prev

    def _cached_states(self) -> set[int]:
        """The Mamba slots the tree holds (one walk of the state order: checked mode only)."""
        return {
            n.mamba_value for n in self.mamba_lru_list._order.values() if n.mamba_value is not None
        }

    def match_prefix(
        self, key: RadixKey, req: MambaReqLike | None = None, cow_mamba: bool = False
    ) -> MambaMatchResult:
        """Longest prefix of ``key`` that ends at a cached state (see the module docstring;
        the reference's checks, on host values: both modes)."""
        self._check_key(key)
        as_bool("cow_mamba", cow_mamba)
        if req is not None:
            check_mamba_req("req", req, MAMBA_FIELDS)
        if cow_mamba and req is None:
            raise InvalidArgumentError("copy-on-write needs the request")
        if cow_mamba and req is not None and req.mamba_pool_idx is not None:
            self._check_state_slot("req.mamba_pool_idx", req.mamba_pool_idx)
        if not len(key):
            return MambaMatchResult(self._empty(), self.root_node)
        value, last, best_len = self._walk(key)
        self.full_lru_list.reset_node_and_parents_mru(last, self.root_node)
        if last is not self.root_node:
            self.mamba_lru_list.reset_node_mru(last)
        staged = False
        if cow_mamba and req is not None and last.mamba_value is not None:
            if req.mamba_pool_idx is None:
                got = self.req_to_token_pool.mamba_allocator.alloc(1)
                if got is None:
                    self.inc_lock_ref(last)  # the state to copy must survive the eviction
                    self.evict_mamba(1)
                    got = self.req_to_token_pool.mamba_allocator.alloc(1)
                    self.dec_lock_ref(last)
                if got is not None:
                    req.mamba_pool_idx = got[0]
            if req.mamba_pool_idx is not None:
                req.mamba_cow_src_index = last.mamba_value
                req.mamba_needs_clear = False
                staged = True
        kept = value[:best_len]  # best_len counts path nodes here (see _walk)
        return MambaMatchResult(torch.cat(kept) if kept else self._empty(), last, staged)

    def insert(
        self, key: RadixKey, value: torch.Tensor, mamba_value: int, prev_prefix_len: int = 0
    ) -> tuple[int, bool]:
        """Cache ``key`` at ``value`` slots with state ``mamba_value`` after its last token.
        Frees ``value``'s slots for tokens already cached at or past ``prev_prefix_len``.
        Returns ``(tokens already cached, whether the end node already had a state)``; when it
        had, ``mamba_value`` was not taken and the caller still owns it. Checked first, as
        the reference (the KV slots' range for a tensor, their ownership and a state slot the
        tree caches only in checked mode)."""
        key, slots, state, prev = self._check_insert(key, value, mamba_value, prev_prefix_len)
        return self._insert(key, slots, state, prev)

    def _insert(
        self, key: RadixKey, value: torch.Tensor, mamba_value: int, prev_prefix_len: int
    ) -> tuple[int, bool]:
        """:meth:`insert` of checked arguments."""
        node, total = self.root_node, 0
        if not len(key):
            return 0, True
        while len(key) and self._child_key(node, key) in node.children:
            node = node.children[self._child_key(node, key)]
            self.full_lru_list.reset_node_mru(node)
            n = self._match_len(node.key, key)
            if prev_prefix_len < total + n:
                start = max(0, prev_prefix_len - total)
                self._free_duplicates(value[start:n])
            total += n
            key, value = key[n:], value[n:]
            if n < len(node.key):
                node = self._split_node(node, n)
        if len(key):
            leaf = self._new_node(key, value.clone(), node, mamba_value)
            node.children[self._child_key(node, key)] = leaf
            self.full_lru_list.insert_mru(leaf)
            self.mamba_lru_list.insert_mru(leaf)
            self.full_evictable_size_ += len(value)
            self.mamba_evictable_size_ += 1
            return total, False
        self.full_lru_list.reset_node_mru(node)
        if node.mamba_value is None:  # a tombstone comes back to life
            node.mamba_value = mamba_value
            self.mamba_lru_list.insert_mru(node)
            self.mamba_evictable_size_ += 1
            return total, False
        return total, True

    def _free_duplicates(self, slots: torch.Tensor) -> None:
        """Give back an insert's KV slots that duplicate what the tree holds (one call per
        overlapped node, in walk order)."""
        self.token_to_kv_pool_allocator.free(slots)

    # ----------------------------------------------------------------- locks
    def _path(self, node: MambaTreeNode) -> list[MambaTreeNode]:
        """Nodes from ``node`` up to (excluding) the root; InvalidArgumentError for something
        that is not a node, LockError if it is detached or another tree's."""
        if not isinstance(node, MambaTreeNode):
            raise InvalidArgumentError(f"node must be a MambaTreeNode, got {node!r}")
        path, cur = [], node
        while cur is not self.root_node:
            parent = cur.parent
            if parent is None or parent.children.get(self._child_key(parent, cur.key)) is not cur:
                raise LockError(f"node {node.node_id} is not in the tree")
            path.append(cur)
            cur = parent
        return path

    def inc_lock_ref(self, node: MambaTreeNode) -> None:
        """Lock ``node``'s state (when it has one) and the KV of its path to the root."""
        path = self._path(node)
        if node.mamba_value is not None:
            if node.mamba_lock_ref == 0:
                self.mamba_evictable_size_ -= 1
                self.mamba_protected_size_ += 1
            node.mamba_lock_ref += 1
        for cur in path:
            if cur.full_lock_ref == 0:
                self.full_evictable_size_ -= len(cur.value)
                self.full_protected_size_ += len(cur.value)
            cur.full_lock_ref += 1

    def _check_unlock(self, node: MambaTreeNode) -> list[MambaTreeNode]:
        """The path :meth:`dec_lock_ref` would unlock, after its checks (nothing changes)."""
        path = self._path(node)
        if node.mamba_value is not None and node.mamba_lock_ref <= 0:
            raise LockError(f"mamba_lock_ref would go negative on node {node.node_id}")
        bad = [cur.node_id for cur in path if cur.full_lock_ref <= 0]
        if bad:
            raise LockError(f"full_lock_ref would go negative on nodes {bad}")
        return path

    def dec_lock_ref(self, node: MambaTreeNode) -> None:
        """Undo :meth:`inc_lock_ref`; LockError (nothing changed) if a count would go negative."""
        path = self._check_unlock(node)
        if node.mamba_value is not None:
            if node.mamba_lock_ref == 1:
                self.mamba_evictable_size_ += 1
                self.mamba_protected_size_ -= 1
            node.mamba_lock_ref -= 1
        for cur in path:
            if cur.full_lock_ref == 1:
                self.full_evictable_size_ += len(cur.value)
                self.full_protected_size_ -= len(cur.value)
            cur.full_lock_ref -= 1

    # ----------------------------------------------------------------- eviction
    def _detach(self, node: MambaTreeNode) -> None:
        parent = node.parent
        assert parent is not None and not node.children
        del parent.children[self._child_key(parent, node.key)]
        self.full_evictable_size_ -= len(node.key)

    def _evict_leaf(self, leaf: MambaTreeNode) -> tuple[int, int]:
        """Free a whole unlocked leaf (KV and state), then every childless unlocked tombstone
        above it; returns ``(tokens, states)`` freed."""
        assert leaf.mamba_value is not None and leaf.full_lock_ref == 0
        self.token_to_kv_pool_allocator.free(leaf.value)
        self.req_to_token_pool.mamba_allocator.free([leaf.mamba_value])
        tokens = len(leaf.value)
        self.full_lru_list.remove(leaf)
        self.mamba_lru_list.remove(leaf)
        self._detach(leaf)
        self.mamba_evictable_size_ -= 1
        node = leaf.parent
        while (node is not None and node is not self.root_node and node.mamba_value is None
               and not node.children and node.full_lock_ref == 0):  # fmt: skip
            self.token_to_kv_pool_allocator.free(node.value)
            tokens += len(node.value)
            self.full_lru_list.remove(node)
            self._detach(node)
            node = node.parent
        return tokens, 1

    def evict_mamba(self, mamba_num: int) -> int:
        """Free at least ``mamba_num`` unlocked states, least recently used first (an inner node
        becomes a tombstone, a leaf goes whole); returns the states freed (``mamba_num`` an
        int >= 0: InvalidArgumentError otherwise)."""
        mamba_num = as_count("mamba_num", mamba_num)
        freed = 0
        while freed < mamba_num:
            node = self.mamba_lru_list.lru_no_lock()
            if node is None:
                break
            assert node.mamba_value is not None and node is not self.root_node
            if node.children:
                self.req_to_token_pool.mamba_allocator.free([node.mamba_value])
                self.mamba_lru_list.remove(node)
                node.mamba_value = None
                self.mamba_evictable_size_ -= 1
                freed += 1
            else:
                freed += self._evict_leaf(node)[1]
        return freed

    def evict_full(self, full_num_tokens: int) -> int:
        """Free at least ``full_num_tokens`` tokens of unlocked leaves, least recently used
        first; returns the tokens freed (``full_num_tokens`` an int >= 0)."""
        full_num_tokens = as_count("full_num_tokens", full_num_tokens)
        freed = 0
        while freed < full_num_tokens:
            leaf = self.full_lru_list.lru_no_lock(leaf_only=True)
            if leaf is None:
                break
            freed += self._evict_leaf(leaf)[0]
        return freed

    def evict(self, num_tokens: int = 0, mamba_num: int = 0) -> tuple[int, int]:
        """:meth:`evict_full` then :meth:`evict_mamba`; returns ``(tokens, states)`` freed
        (both ints >= 0: InvalidArgumentError otherwise, nothing changed)."""
        num_tokens = as_count("num_tokens", num_tokens)
        mamba_num = as_count("mamba_num", mamba_num)
        full = self.evict_full(num_tokens) if num_tokens > 0 else 0
        return full, self.evict_mamba(mamba_num) if mamba_num > 0 else 0

    # ----------------------------------------------------------------- snapshot
    def snapshot(self) -> MambaTreeSnapshot:
        """Plain copy of every node (pre-order), the sizes and both LRU orders."""
        nodes = tuple(
            [
                filled_record(
                    MambaNodeSnapshot,
                    {
                        "node_id": n.node_id,
                        "parent_id": None if n.parent is None else n.parent.node_id,
                        "key": tuple(n.key.token_ids),
                        "extra_key": n.key.extra_key,
                        "value": tuple(map(int, n.value.tolist())),
                        "mamba_value": n.mamba_value,
                        "full_lock_ref": n.full_lock_ref,
                        "mamba_lock_ref": n.mamba_lock_ref,
                        "child_ids": tuple([c.node_id for c in n.children.values()]),
                    },
                )
                for n in self._nodes()
            ]
        )
        return filled_record(
            MambaTreeSnapshot,
            {
                "full_evictable_size": self.full_evictable_size_,
                "mamba_evictable_size": self.mamba_evictable_size_,
                "full_protected_size": self.full_protected_size_,
                "mamba_protected_size": self.mamba_protected_size_,
                "nodes": nodes,
                "full_lru": self.full_lru_list.ids(),
                "mamba_lru": self.mamba_lru_list.ids(),
                "unified": False,
            },
        )


__all__ = ["MambaMatchResult", "MambaRadixCache"]

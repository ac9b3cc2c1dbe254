"""``SWARadixCache`` (optimized twin): the prefix tree of a hybrid sliding-window model.

Twin of :mod:`kvpool.reference.swa.radix_cache` (same rules, node ids, results and errors; read
its module docstring). Node values are int64 slot tensors on the allocator's device and every
allocator call passes tensors; keys are :class:`kvpool.optimized.radix_key.RadixKey`. The tree
walk itself is plain Python over token lists, as in the reference: a sliding-window tree is
walked per request, and its cost is dominated by the allocator calls it makes. Under
``is_eagle`` the bigram codes of a key come from one vectorised shift and ``|``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvpool.constants import floor_align
from kvpool.errors import InvalidArgumentError, LockError
from kvpool.host_checks import as_bool, as_count, as_int
from kvpool.optimized.options import TwinOptions, options_of
from kvpool.optimized.radix.checks import tree_slots
from kvpool.optimized.radix_key import RadixKey, bigram_key
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.optimized.swa.tree_node import SWATreeNode
from kvpool.records import fast_record
from kvpool.reference.radix.checks import (  # pure host checks, shared
    check_count,
    check_flag,
    check_key,
)
from kvpool.reference.radix.radix_cache import logical_clock
from kvpool.reference.radix_key import ChildKey, tree_slot_limit
from kvpool.reference.swa.radix_cache import STAMP_STEP
from kvpool.snapshot import NodeSnapshot, TreeSnapshot


@dataclass
class SWAMatchResult:
    """What ``match_prefix`` returns: the matched full slots and the deepest usable node."""

    device_indices: torch.Tensor
    last_device_node: SWATreeNode


class SWARadixCache:
    """Prefix tree over an :class:`SWATokenToKVPoolAllocator` (see the module docstring).
    ``options``: the twin's :class:`~kvpool.optimized.options.TwinOptions`; a tree built alone
    over collaborators and given none runs as its allocator does (:func:`~kvpool.optimized.options.
    options_of`)."""

    def __init__(
        self,
        token_to_kv_pool_allocator: SWATokenToKVPoolAllocator,
        page_size: int,
        sliding_window_size: int,
        clock: Callable[[], float] | None = None,
        *,
        options: TwinOptions | None = None,
        is_eagle: bool = False,
    ) -> None:
        if sliding_window_size < 1:
            raise InvalidArgumentError(f"sliding_window_size must be >= 1: {sliding_window_size}")
        self.is_eagle = check_flag("is_eagle", is_eagle)
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.sliding_window_size = sliding_window_size
        self.clock = clock if clock is not None else logical_clock()
        self.options = options if options is not None else options_of(token_to_kv_pool_allocator)
        self.device = self.options.device
        self._walk_now, self._walk_seq = 0.0, 0
        self.reset()

    def reset(self) -> None:
        """Forget the tree (frees nothing); node ids and swa_uuids restart."""
        self._next_id, self._next_uuid = 0, 0
        self.root_node = self._new_node(RadixKey([]), self._slots([]), None, 0.0)
        self.root_node.full_lock_ref = self.root_node.swa_lock_ref = 1
        self.full_evictable_size_ = self.full_protected_size_ = 0
        self.swa_evictable_size_ = self.swa_protected_size_ = 0

    def _slots(self, values: list[int] | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64, device=self.device).reshape(-1)

    def _new_node(self, key: RadixKey, value: torch.Tensor, parent: SWATreeNode | None,
                  now: float) -> SWATreeNode:  # fmt: skip
        node = SWATreeNode(self._next_id, key, value, parent, now)
        self._next_id += 1
        return node

    # ----------------------------------------------------------------- sizes
    def full_evictable_size(self) -> int:
        return self.full_evictable_size_

    def full_protected_size(self) -> int:
        return self.full_protected_size_

    def swa_evictable_size(self) -> int:
        return self.swa_evictable_size_

    def swa_protected_size(self) -> int:
        return self.swa_protected_size_

    # ----------------------------------------------------------------- tree helpers
    def _tree_key(self, key: RadixKey) -> RadixKey:
        """The key the tree stores for token key ``key``: its bigrams under ``is_eagle``."""
        return bigram_key(key) if self.is_eagle else key

    def _child_key(self, parent: SWATreeNode, key: RadixKey) -> ChildKey:
        plain = key.plain_child_key(self.page_size)
        return (key.extra_key, plain) if parent is self.root_node else plain

    def _match_len(self, node_key: RadixKey, key: RadixKey) -> int:
        a, b, ps = node_key.token_ids, key.token_ids, self.page_size
        n, limit = 0, min(len(a), len(b))
        while n + ps <= limit and a[n : n + ps] == b[n : n + ps]:
            n += ps
        return n

    def _split_node(self, child: SWATreeNode, split_len: int) -> SWATreeNode:
        """Cut ``child`` after ``split_len`` tokens; the new upper node (next id) copies the
        locks and the tombstone flag and takes the swa_uuid; both halves become the most
        recently used, the upper one first (SGLang re-inserts them into its LRU lists)."""
        parent = child.parent
        assert parent is not None
        dict_key = self._child_key(parent, child.key)
        upper = self._new_node(child.key[:split_len], child.value[:split_len], parent,
                               self._stamp())  # fmt: skip
        child.last_access_time = self._stamp()
        upper.full_lock_ref, upper.swa_lock_ref = child.full_lock_ref, child.swa_lock_ref
        upper.swa_tombstone = child.swa_tombstone
        upper.swa_uuid, child.swa_uuid = child.swa_uuid, None
        child.key, child.value = child.key[split_len:], child.value[split_len:]
        child.parent = upper
        upper.children[self._child_key(upper, child.key)] = child
        parent.children[dict_key] = upper
        return upper

    def _add_node(self, parent: SWATreeNode, key: RadixKey, value: torch.Tensor,
                  tombstone: bool) -> SWATreeNode:  # fmt: skip
        node = self._new_node(key, value.clone(), parent, self._stamp())  # not the caller's view
        node.swa_tombstone = tombstone
        parent.children[self._child_key(parent, key)] = node
        self.full_evictable_size_ += len(key)
        if not tombstone:
            self.swa_evictable_size_ += len(key)
        return node

    def _start_walk(self) -> None:
        """One clock read per walk; :meth:`_stamp` orders the stamps inside it."""
        self._walk_now, self._walk_seq = self.clock(), 0

    def _stamp(self) -> float:
        """The current walk's time plus a tiny step per stamp: each stamp is more recent than
        the one before (SGLang moves nodes to the front of its LRU lists one at a time)."""
        self._walk_seq += 1
        return self._walk_now + self._walk_seq * STAMP_STEP

    def _touch_path(self, node: SWATreeNode) -> None:
        """Stamp ``node`` and its ancestors, nearest the root first (so ``node`` is the most
        recent, as SGLang's ``reset_node_and_parents_mru``)."""
        path = []
        while node is not self.root_node and node.parent is not None:
            path.append(node)
            node = node.parent
        for cur in reversed(path):
            cur.last_access_time = self._stamp()

    # ----------------------------------------------------------------- match / insert
    def match_prefix(self, key: RadixKey) -> SWAMatchResult:
        """Slots of the longest usable cached prefix (see the module docstring) and its node;
        splits a node where the walk ends inside it. InvalidArgumentError unless ``key`` is a
        RadixKey. Under ``is_eagle`` a key of ``n`` tokens matches at most ``n - 1`` slots."""
        check_key(key, RadixKey)
        key = self._tree_key(key)
        key = key[: floor_align(len(key), self.page_size)]
        if len(key) == 0:
            return SWAMatchResult(self._slots([]), self.root_node)
        self._start_walk()
        node, values = self.root_node, list[torch.Tensor]()
        since_tombstone = float("inf")  # a path from the root without tombstone always counts
        best_len, best = 0, self.root_node
        window = self.sliding_window_size
        while len(key) > 0:
            child = node.children.get(self._child_key(node, key))
            if child is None:
                break
            if child.swa_tombstone:
                if since_tombstone >= window:
                    best_len, best = len(values), node
                since_tombstone = 0
            n = self._match_len(child.key, key)
            split = n < len(child.key)
            if split:
                child = self._split_node(child, n)
            values.append(child.value)
            if not child.swa_tombstone:
                since_tombstone += len(child.value)
            node = child
            if split:
                break
            key = key[n:]
        if since_tombstone >= window:
            best_len, best = len(values), node
        self._touch_path(best)
        parts = values[:best_len]
        return SWAMatchResult(torch.cat(parts) if parts else self._slots([]), best)

    def insert(self, key: RadixKey, value: torch.Tensor, prev_prefix_len: int = 0,
               swa_evicted_seqlen: int = 0) -> int:  # fmt: skip
        """Insert the page-aligned part of ``key`` at full slots ``value``; frees the incoming
        duplicates past ``prev_prefix_len`` and recovers matched tombstones (module docstring).
        Returns the tokens that were already cached. InvalidArgumentError for fewer slots than
        tokens or an ``swa_evicted_seqlen`` that is not a page multiple in ``[0, len(key)]``.

        Checked before any change as the reference: the key and the counts (both modes); the
        slots' dtype and shape (both modes), their range and distinctness, and that the caller
        holds the page-aligned part (checked mode, or host values:
        :func:`~kvpool.optimized.radix.checks.tree_slots`). Under ``is_eagle`` every bound
        counts the key's bigrams (its tokens less one)."""
        check_key(key, RadixKey)
        key = self._tree_key(key)
        prev_prefix_len = as_count("prev_prefix_len", prev_prefix_len)
        swa_evicted_seqlen = as_count("swa_evicted_seqlen", swa_evicted_seqlen)
        if prev_prefix_len > len(key):
            raise InvalidArgumentError(f"prev_prefix_len {prev_prefix_len} past {len(key)} tokens")
        aligned = floor_align(len(key), self.page_size)
        if swa_evicted_seqlen > aligned or swa_evicted_seqlen % self.page_size:
            raise InvalidArgumentError(f"bad swa_evicted_seqlen {swa_evicted_seqlen}")
        alloc = self.token_to_kv_pool_allocator
        checked = self.options.checked
        host = not isinstance(value, torch.Tensor)
        value = tree_slots(value, len(key), self.device, checked, tree_slot_limit(alloc))
        key = key[: floor_align(len(key), self.page_size)]
        value = value[: len(key)]
        if checked or host:
            alloc._check_full_held(value)
        if len(key) == 0:
            return 0
        self._start_walk()
        node, total = self.root_node, 0
        while len(key) > 0:
            child = node.children.get(self._child_key(node, key))
            if child is None:
                break
            child.last_access_time = self._stamp()
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
            node = child
            if prev_prefix_len < total + n:
                self._merge_matched(node, value[:n], total, swa_evicted_seqlen)
            total += n
            key, value = key[n:], value[n:]
        if len(key) > 0:
            if swa_evicted_seqlen == total + len(key):
                alloc.free(value)  # no window KV left: a tombstone leaf is never created
                return total
            if swa_evicted_seqlen > total:
                cut = swa_evicted_seqlen - total
                node = self._add_node(node, key[:cut], value[:cut], tombstone=True)
                key, value = key[cut:], value[cut:]
            self._add_node(node, key, value, tombstone=False)
        return total

    def _merge_matched(self, node: SWATreeNode, incoming: torch.Tensor, start: int,
                       swa_evicted_seqlen: int) -> None:  # fmt: skip
        """The incoming slots of a matched node (tokens ``[start, start + len(incoming))``):
        free them as duplicates, or recover the node from them if it is a tombstone."""
        alloc = self.token_to_kv_pool_allocator
        n = len(incoming)
        if not node.swa_tombstone or swa_evicted_seqlen >= start + n:
            alloc.free(incoming)  # a duplicate (or a tombstone whose window KV is gone too)
            return
        cut = max(swa_evicted_seqlen - start, 0)
        if cut:
            # the first `cut` tokens stay a tombstone (upper half); recover the lower half
            self._split_node(node, cut)
        if node.full_lock_ref > 0:
            # a running request reads these full slots: keep them, adopt the incoming SWA
            alloc.set_full_to_swa_mapping(node.value, alloc.translate_loc_from_full_to_swa(
                incoming[cut:]))  # fmt: skip
            alloc.set_full_to_swa_mapping(incoming[cut:], torch.zeros_like(incoming[cut:]))
            alloc.full_attn_allocator.free(incoming[cut:])
        else:
            alloc.free(node.value)
            node.value = incoming[cut:].clone()
        if cut:
            alloc.free(incoming[:cut])  # after the recovery's frees, as SGLang orders them
        node.swa_tombstone = False
        self.swa_evictable_size_ += n - cut

    # ----------------------------------------------------------------- locks
    def _path_to_root(self, node: SWATreeNode) -> list[SWATreeNode]:
        """Nodes from ``node`` up to (excluding) the root: InvalidArgumentError unless it is an
        SWATreeNode, LockError when it is not in this tree."""
        if not isinstance(node, SWATreeNode):
            raise InvalidArgumentError(f"node must be an SWATreeNode, got {node!r}")
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

    @staticmethod
    def _check_uuid(uuid: object) -> None:
        if uuid is not None:
            as_int("swa_uuid_for_lock", uuid)

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
        LockError (nothing changed) if a count would go negative; InvalidArgumentError for a
        ``swa_uuid_for_lock`` that is neither None nor an integer or a non-bool ``skip_swa``."""
        path = self._path_to_root(node)
        self._check_uuid(swa_uuid_for_lock)
        as_bool("skip_swa", skip_swa)
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
        lock loses its SWA slots at once (tombstone). LockError (nothing changed) if absent;
        InvalidArgumentError for a ``swa_uuid_for_lock`` that is neither None nor an integer."""
        path = self._path_to_root(node)
        self._check_uuid(swa_uuid_for_lock)
        part = self._swa_part(path, swa_uuid_for_lock)
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

    # ----------------------------------------------------------------- eviction
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
        allows (module docstring); returns (full tokens freed, SWA tokens freed).
        InvalidArgumentError unless both are counts."""
        num_tokens = check_count("num_tokens", num_tokens)
        swa_num_tokens = check_count("swa_num_tokens", swa_num_tokens)
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

    # ----------------------------------------------------------------- views
    def snapshot(self) -> TreeSnapshot:
        """Nodes in BFS order (children in insertion order), root first; ``lock_ref`` is the full
        lock count."""
        nodes, queue, ps = [], [self.root_node], self.page_size
        for node in queue:  # breadth-first: the list grows behind the loop, nothing popped
            kids = list(node.children.values())
            nodes.append(_NODE(node_id=node.node_id,
                parent_id=None if node.parent is None else node.parent.node_id,
                key=tuple(node.key.token_ids), extra_key=node.key.extra_key,
                value=tuple(node.value.tolist()), lock_ref=node.full_lock_ref,
                child_ids=tuple([c.node_id for c in kids]),
                child_keys=tuple([tuple(c.key.token_ids[:ps]) for c in kids]),
                last_access_time=node.last_access_time, hit_count=0, priority=0,
                swa_tombstone=node.swa_tombstone, swa_lock_ref=node.swa_lock_ref,
                evicted=False, host_value=None, host_ref_counter=0,
                write_pending=False))  # fmt: skip
            queue.extend(kids)
        return TreeSnapshot(self.page_size, False, "lru", self.full_evictable_size_,
                            self.full_protected_size_, tuple(nodes), self.swa_evictable_size_,
                            self.swa_protected_size_)  # fmt: skip


_NODE = fast_record(NodeSnapshot)
"""Builds a :class:`NodeSnapshot` (every field by keyword: :func:`fast_record`)."""


__all__ = ["SWAMatchResult", "SWARadixCache"]

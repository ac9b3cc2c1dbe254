"""``RadixCache``: the page-aligned prefix tree over token slots (SGLang's RadixCache).

Units: sizes and lengths are tokens; node values are token slots. With ``page_size > 1`` every key
and value in the tree is a whole number of pages, and children are keyed by their first page.

Decisions (both twins follow them exactly):

- Clock: ``match_prefix`` and ``insert`` read the clock exactly once, and only when they walk the
  tree (not when disabled, not when the page-aligned key is empty). The default clock is a logical
  counter returning 1.0, 2.0, ... The root's times stay 0.0 forever; construction and ``reset``
  read no clock. ``reset`` restarts node ids at 0 (root) and frees nothing.
- Touching: every node entered on the walk (root excluded) gets ``last_access_time = now``; the
  node a walk ends inside is stamped *before* it is split, so both halves carry ``now``. Only
  ``insert`` counts hits, as SGLang 0.5.16 does: ``hit_count += 1`` on every node of the matched
  path (the upper half of a split, not the lower) and on the new leaf, unless ``chunked``; given
  ``inserted_len`` (SGLang 0.5.23), only on those nodes that end past ``inserted_len`` tokens.
  ``insert`` raises ``priority`` to ``max(old, priority)`` on the same path nodes and gives the new
  leaf ``priority``. ``match_prefix`` changes no count and no priority.
- Split at ``k`` tokens: a new node (next id) takes ``key[:k]``/``value[:k]``, the lock count,
  ``hit_count`` and ``priority`` of the old node, ``creation_time = now`` (SGLang creates it
  then) and ``last_access_time = now``, and replaces the old node in its parent's children under
  the same dict key (same insertion position); the old node keeps its id and becomes the lower
  half, the only child of the new node.
- Ties: one clock value stamps a whole walk, where SGLang reads its clock again for each node it
  creates; node ids grow in creation order, so the policies break ties by node id in the
  direction of SGLang's clock (:mod:`~kvpool.reference.radix.evict_policy`).
- Locks on a node that is no longer in the tree raise LockError; ``inc_lock_ref`` /
  ``dec_lock_ref`` return the change in ``evictable_size`` (<= 0 / >= 0).
- ``evict(n)``: heap of the unlocked leaves keyed by :mod:`~kvpool.reference.radix.evict_policy`;
pop,
  free the value through the allocator, detach, and push the parent when it became an unlocked
  non-root leaf (with its key as of that moment). Stops once ``>= n`` tokens are freed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from kvpool.constants import floor_align, is_power_of_two
from kvpool.errors import ConfigError, InvalidArgumentError, LockError, PageSizeError
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix.evict_policy import PriorityKey, get_priority_fn
from kvpool.reference.radix.radix_release import RadixRelease
from kvpool.reference.radix.tree_view import pretty_print_tree, snapshot_tree
from kvpool.reference.radix_key import (
    ChildKey,
    MatchResult,
    RadixKey,
    TreeNode,
    check_tree_slots,
    tree_slot_limit,
)
from kvpool.rules import Rules
from kvpool.snapshot import TreeSnapshot


def hit_floor(chunked: bool, inserted_len: int | None) -> float:
    """An insert counts a hit on a node (path node or new leaf) iff the node ends past this many
    tokens: ``inserted_len`` when given (SGLang 0.5.23), else 0 (every node) or, for a
    ``chunked`` insert, infinity (none; SGLang 0.5.16)."""
    if inserted_len is not None:
        return float(inserted_len)
    return float("inf") if chunked else 0.0


def logical_clock() -> Callable[[], float]:
    """A deterministic clock: returns 1.0, 2.0, 3.0, ... one step per read."""
    ticks = [0.0]

    def read() -> float:
        ticks[0] += 1.0
        return ticks[0]

    return read


class RadixCache(RadixRelease):
    """Prefix cache over ``token_to_kv_pool_allocator``'s slots (see the module docstring for the
    clock, split and eviction rules). ``evictable_size_ + protected_size_ == total_size()``."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: BaseTokenToKVPoolAllocator,
        page_size: int,
        disable: bool = False,
        eviction_policy: str = "lru",
        clock: Callable[[], float] | None = None,
        *,
        rules: Rules | None = None,
    ) -> None:
        if not isinstance(page_size, int) or not is_power_of_two(page_size):
            raise PageSizeError(f"page_size must be a positive power of two, got {page_size!r}")
        if page_size != token_to_kv_pool_allocator.page_size:
            raise ConfigError(
                f"page_size {page_size} differs from the allocator's "
                f"{token_to_kv_pool_allocator.page_size}"
            )
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.rules = rules if rules is not None else Rules()
        self.disable = disable
        self.eviction_policy = eviction_policy.lower()
        self.priority_fn: Callable[[TreeNode], PriorityKey] = get_priority_fn(self.eviction_policy)
        self.clock = clock if clock is not None else logical_clock()
        self.reset()

    # ----------------------------------------------------------------- basics
    def reset(self) -> None:
        """Forget the whole tree (frees nothing); node ids restart at 0 (the root)."""
        self._next_id = 0
        self.root_node = self._new_node(RadixKey([]), [], None, 0.0)
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0

    def _new_node(
        self,
        key: RadixKey,
        value: list[int],
        parent: TreeNode | None,
        now: float,
        priority: int = 0,
    ) -> TreeNode:
        node = TreeNode(self._next_id, key, value, parent, now, priority)
        self._next_id += 1
        return node

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes."""
        return self.evictable_size_

    def protected_size(self) -> int:
        """Tokens in locked nodes (root excluded)."""
        return self.protected_size_

    def total_size(self) -> int:
        """Tokens in every non-root node (recomputed by a walk)."""
        total = 0
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            total += len(node.key)
            stack.extend(node.children.values())
        return total

    def _child_key(self, parent: TreeNode, key: RadixKey) -> ChildKey:
        plain = key.plain_child_key(self.page_size)
        return (key.extra_key, plain) if parent is self.root_node else plain

    def _match_len(self, node_key: RadixKey, key: RadixKey) -> int:
        """Common prefix length of two keys, in whole pages (tokens)."""
        a, b, ps = node_key.token_ids, key.token_ids, self.page_size
        n = 0
        limit = min(len(a), len(b))
        while n + ps <= limit and a[n : n + ps] == b[n : n + ps]:
            n += ps
        return n

    def _align(self, key: RadixKey) -> RadixKey:
        return key[: floor_align(len(key), self.page_size)]

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut ``child`` after ``split_len`` tokens; returns the new upper node (next id, created
        at the walk's time, which ``child`` was just stamped with)."""
        parent = child.parent
        assert parent is not None
        dict_key = self._child_key(parent, child.key)
        now = child.last_access_time
        upper = self._new_node(child.key[:split_len], child.value[:split_len], parent, now)
        upper.hit_count = child.hit_count
        upper.priority = child.priority
        upper.lock_ref = child.lock_ref
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        child.parent = upper
        upper.children[self._child_key(upper, child.key)] = child
        parent.children[dict_key] = upper  # same dict key: keeps the insertion position
        return upper

    # ----------------------------------------------------------------- match / insert
    def match_prefix(self, key: RadixKey) -> MatchResult:
        """Longest cached page-aligned prefix of ``key``; splits where the match ends inside a node.
        Returns the matched slots and the deepest matched node (root if none)."""
        key = self._align(key)
        if self.disable or len(key) == 0:
            return MatchResult([], self.root_node, self.root_node)
        now = self.clock()
        node = self.root_node
        values: list[int] = []
        while len(key) > 0:
            child = node.children.get(self._child_key(node, key))
            if child is None:
                break
            child.last_access_time = now
            n = self._match_len(child.key, key)
            split = n < len(child.key)
            if split:
                child = self._split_node(child, n)
            values.extend(child.value)
            node = child
            if split:
                break
            key = key[n:]
        return MatchResult(values, node, node)

    def insert(
        self,
        key: RadixKey,
        value: list[int] | None = None,
        priority: int = 0,
        chunked: bool = False,
        inserted_len: int | None = None,
    ) -> int:
        """Insert the page-aligned part of ``key`` at ``value`` slots (default: the token ids, for
        tests). Returns the tokens already cached (a multiple of the page size). Frees nothing:
        the caller frees its duplicate slots ``value[cache_protected_len:returned]``. Counts a
        hit on the matched path and the new leaf unless ``chunked`` (a chunk of a prefill);
        given ``inserted_len`` (tokens), only on the nodes ending past it (:func:`hit_floor`)."""
        explicit = value is not None
        if value is None:
            value = list(key.token_ids)
        if len(value) < len(key):
            raise InvalidArgumentError(f"{len(value)} slots for a key of {len(key)} tokens")
        if explicit:  # the token ids stand in for slots in tests only
            value = check_tree_slots(
                value[: len(key)], tree_slot_limit(self.token_to_kv_pool_allocator)
            )
        if self.disable:
            return 0
        key = self._align(key)
        value = list(value[: len(key)])
        if len(key) == 0:
            return 0
        now = self.clock()
        floor = hit_floor(chunked, inserted_len)
        node = self.root_node
        total_prefix = 0
        while len(key) > 0:
            child = node.children.get(self._child_key(node, key))
            if child is None:
                break
            child.last_access_time = now
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
            child.priority = max(child.priority, priority)
            total_prefix += n
            child.hit_count += 1 if total_prefix > floor else 0
            key, value = key[n:], value[n:]
            node = child
        if len(key) > 0:
            leaf = self._new_node(key, value, node, now, priority)
            leaf.hit_count = 1 if total_prefix + len(key) > floor else 0
            node.children[self._child_key(node, key)] = leaf
            self.evictable_size_ += len(key)
        return total_prefix

    # ----------------------------------------------------------------- locks
    def _path_to_root(self, node: TreeNode) -> list[TreeNode]:
        """Nodes from ``node`` up to (excluding) the root; LockError if ``node`` is detached."""
        path: list[TreeNode] = []
        cur = node
        while cur is not self.root_node:
            parent = cur.parent
            if parent is None or parent.children.get(self._child_key(parent, cur.key)) is not cur:
                raise LockError(f"node {node.node_id} is not in the tree")
            path.append(cur)
            cur = parent
        return path

    def inc_lock_ref(self, node: TreeNode | None) -> int:
        """Lock the path ``node`` -> root; returns the change in evictable size (<= 0)."""
        if self.disable or node is None:
            return 0
        delta = 0
        for cur in self._path_to_root(node):
            if cur.lock_ref == 0:
                self.evictable_size_ -= len(cur.key)
                self.protected_size_ += len(cur.key)
                delta -= len(cur.key)
            cur.lock_ref += 1
        return delta

    def dec_lock_ref(self, node: TreeNode | None) -> int:
        """Unlock the path ``node`` -> root; returns the change in evictable size (>= 0).
        LockError (nothing changed) if a count would go negative."""
        if self.disable or node is None:
            return 0
        path = self._path_to_root(node)
        bad = [cur.node_id for cur in path if cur.lock_ref <= 0]
        if bad:
            raise LockError(f"lock_ref would go negative on nodes {bad}")
        delta = 0
        for cur in path:
            cur.lock_ref -= 1
            if cur.lock_ref == 0:
                self.evictable_size_ += len(cur.key)
                self.protected_size_ -= len(cur.key)
                delta += len(cur.key)
        return delta

    # ----------------------------------------------------------------- eviction
    def _leaves(self) -> list[TreeNode]:
        out: list[TreeNode] = []
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            if node.is_leaf() and node is not self.root_node:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def evict(self, num_tokens: int) -> int:
        """Free whole unlocked leaves by policy until ``>= num_tokens`` tokens are freed or none is
        left; returns the tokens freed."""
        if num_tokens < 0:
            raise InvalidArgumentError(f"num_tokens must be >= 0, got {num_tokens}")
        if self.disable or num_tokens == 0:
            return 0
        # Keys end with the node id, so two entries never compare their nodes.
        heap = [(self.priority_fn(leaf), leaf) for leaf in self._leaves() if leaf.lock_ref == 0]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            self._free_tree_slots(node.value, 0)
            del parent.children[self._child_key(parent, node.key)]
            node.parent = None
            self.evictable_size_ -= len(node.key)
            evicted += len(node.key)
            if parent is not self.root_node and parent.is_leaf() and parent.lock_ref == 0:
                heapq.heappush(heap, (self.priority_fn(parent), parent))
        return evicted

    # ----------------------------------------------------------------- requests
    def pretty_print(self) -> str:
        """The tree, one node a line (id, key/value preview, lock_ref, access time)."""
        return pretty_print_tree(self)

    def snapshot(self) -> TreeSnapshot:
        """Plain snapshot; nodes in BFS order by child insertion order, root first."""
        return snapshot_tree(self)


__all__ = ["RadixCache", "logical_clock"]

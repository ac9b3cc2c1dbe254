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
- Release path: ``cache_finished_req`` (a request finishes), ``cache_unfinished_req`` (between
  prefill chunks) and, under ``Rules.release_path == "checkpoint"``, SGLang 0.5.23's
  ``checkpoint`` hand a request's KV to the tree; slots the tree owned go back through
  ``Rules.tree_free``.
- EAGLE (``is_eagle``, SGLang's ``CacheInitParams.is_eagle``): ``match_prefix`` and ``insert``
  take token keys and key the tree by their bigrams (:func:`~kvpool.reference.radix_key.
  bigram_key`: one element fewer, element ``i`` at token ``i``'s slot), as SGLang's
  ``maybe_to_bigram_view``; the release paths cache ``floor_align(n - 1)`` of a request's ``n``
  tokens, so the last token's slot always goes back as part of the tail.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from kvpool.constants import floor_align, is_power_of_two
from kvpool.errors import ConfigError, InvalidArgumentError, LockError, PageSizeError
from kvpool.host_checks import int_list
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix.checks import (
    check_count,
    check_distinct,
    check_flag,
    check_held,
    check_insert_flags,
    check_key,
    check_release,
    check_row_read_len,
    check_up_to,
    fill_len,
)
from kvpool.reference.radix.evict_policy import PriorityKey, get_priority_fn
from kvpool.reference.radix.tree_view import pretty_print_tree, snapshot_tree
from kvpool.reference.radix_key import (
    ChildKey,
    MatchResult,
    RadixKey,
    TreeNode,
    bigram_key,
    cached_len,
    check_tree_slots,
    tree_slot_limit,
)
from kvpool.reference.req import Req
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


class RadixCache:
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
        is_eagle: bool = False,
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
        self.is_eagle = check_flag("is_eagle", is_eagle)
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

    def _tree_key(self, key: RadixKey) -> RadixKey:
        """The key the tree stores for token key ``key``: its bigrams under ``is_eagle``."""
        return bigram_key(key) if self.is_eagle else key

    def _cached_len(self, num_tokens: int) -> int:
        return cached_len(num_tokens, self.page_size, self.is_eagle)

    def _req_key(self, req: Req, num_tokens: int) -> RadixKey:
        """The token key of what the tree caches of the request's first ``num_tokens`` tokens:
        :meth:`_cached_len` tokens, one more under ``is_eagle`` (its last bigram's second)."""
        cached = self._cached_len(num_tokens)
        stop = cached + self.is_eagle if cached else 0
        return RadixKey(req.all_token_ids[:stop], req.extra_key)

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
        Returns the matched slots and the deepest matched node (root if none).
        InvalidArgumentError unless ``key`` is a RadixKey."""
        check_key(key, RadixKey)
        key = self._align(self._tree_key(key))
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
        given ``inserted_len`` (tokens), only on the nodes ending past it (:func:`hit_floor`).

        Checked before any change: ``key`` a RadixKey, ``priority`` an integer, ``chunked`` a
        bool, ``inserted_len`` None or a count (InvalidArgumentError); ``value`` integers, at
        least one per token, inside the pool and not slot 0 (:func:`check_tree_slots`), no slot
        named twice (DoubleFreeError: the tree would free it twice), the page-aligned part
        (what the tree may own) allocated (InvalidArgumentError). Under ``is_eagle`` the tree
        stores ``key``'s bigrams (one element fewer) at the first slots of ``value``."""
        check_key(key, RadixKey)
        check_insert_flags(priority, chunked, inserted_len)
        explicit = value is not None
        value = int_list("value", value) if value is not None else list(key.token_ids)
        key = self._tree_key(key)
        if len(value) < len(key):
            raise InvalidArgumentError(f"{len(value)} slots for a key of {len(key)} tokens")
        if explicit:  # the token ids stand in for slots in tests only
            value = check_tree_slots(
                value[: len(key)], tree_slot_limit(self.token_to_kv_pool_allocator)
            )
            check_distinct(value)
            aligned = floor_align(len(key), self.page_size)
            check_held(self.token_to_kv_pool_allocator, value[:aligned])
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

    def _check_node(self, node: object) -> list[TreeNode]:
        """``node``'s path to the root (empty for None): InvalidArgumentError unless it is a
        TreeNode, LockError when it is not in this tree."""
        if node is None:
            return []
        if not isinstance(node, TreeNode):
            raise InvalidArgumentError(f"node must be a TreeNode or None, got {node!r}")
        return self._path_to_root(node)

    def _check_unlock(self, node: object) -> None:
        """What :meth:`dec_lock_ref` of ``node`` checks, before a release changes anything."""
        path = self._check_node(node)
        if self.disable:
            return
        bad = [cur.node_id for cur in path if cur.lock_ref <= 0]
        if bad:
            raise LockError(f"lock_ref would go negative on nodes {bad}")

    def inc_lock_ref(self, node: TreeNode | None) -> int:
        """Lock the path ``node`` -> root; returns the change in evictable size (<= 0).
        InvalidArgumentError for a non-node, LockError for a node not in the tree."""
        path = self._check_node(node)
        if self.disable or node is None:
            return 0
        delta = 0
        for cur in path:
            if cur.lock_ref == 0:
                self.evictable_size_ -= len(cur.key)
                self.protected_size_ += len(cur.key)
                delta -= len(cur.key)
            cur.lock_ref += 1
        return delta

    def dec_lock_ref(self, node: TreeNode | None) -> int:
        """Unlock the path ``node`` -> root; returns the change in evictable size (>= 0).
        LockError (nothing changed) if a count would go negative or the node is not in the
        tree; InvalidArgumentError for a non-node."""
        path = self._check_node(node)
        if self.disable or node is None:
            return 0
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
        left; returns the tokens freed. InvalidArgumentError unless ``num_tokens`` is a count."""
        num_tokens = check_count("num_tokens", num_tokens)
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

    # ----------------------------------------------------------------- release path
    def _free_tree_slots(self, slots: list[int], start_pos: int) -> None:
        """Return slots the tree owned (an evicted node's, a finished request's duplicates
        starting at column ``start_pos``) as ``rules.tree_free`` says: ``free`` or SGLang
        0.5.23's ``free_segment``."""
        if self.rules.tree_free == "segment":
            self.token_to_kv_pool_allocator.free_segment(slots, start_pos)
        else:
            self.token_to_kv_pool_allocator.free(slots)

    def _insert_req(self, req: Req, key: RadixKey, value: list[int], chunked: bool) -> int:
        """Insert ``key`` for ``req``, counting hits as ``rules.hit_count`` says (``chunked``, or
        past ``req.cache_inserted_len``, which then rises to the key's length)."""
        if self.rules.hit_count == "chunked":
            return self.insert(key, value, priority=req.priority, chunked=chunked)
        done = self.insert(key, value, priority=req.priority, inserted_len=req.cache_inserted_len)
        req.cache_inserted_len = max(req.cache_inserted_len, self._cached_len(len(key)))
        return done

    def _insert_checkpoint(self, req: Req, key: RadixKey, value: list[int], chunked: bool) -> int:
        """:meth:`checkpoint`'s insert of ``key`` for ``req`` (hits as :meth:`_insert_req`) and
        the free of the duplicates ``value[cache_protected_len:cached]``: one free
        (``rules.tree_free``) in the legacy tree. Returns ``cached``, the tokens of ``key`` the
        tree held already. (SGLang frees after the prompt's re-insert, which touches no slot:
        the order is not observable.)"""
        protected = req.cache_protected_len
        cached = self._insert_req(req, key, value, chunked)
        self._free_tree_slots(value[protected:cached], protected)
        return cached

    def checkpoint(self, req: Req, up_to: int, chunked: bool = False) -> list[int]:
        """SGLang 0.5.23's ``checkpoint``: insert the page-aligned part of the first ``up_to``
        tokens (the row's slots; hits by ``rules.hit_count`` and ``chunked``); when the
        page-aligned prompt is shorter but not empty, insert it again with ``priority + 1`` and
        no hit (the leaf splits at the prompt boundary); free the duplicates
        ``row[cache_protected_len:already cached]`` (:meth:`_insert_checkpoint`: one free by
        ``rules.tree_free``, the unified tree one per overlapped node); match the key again,
        rewrite ``row[cache_protected_len:matched]`` with the tree's slots, and move
        ``cache_protected_len`` (to the key's length) and the lock to the matched node. Returns
        ``row[:up_to]`` as it is afterwards.

        Checked before any change: ``up_to`` a count, ``chunked`` a bool, the request
        (:func:`~kvpool.reference.radix.checks.check_release` up to ``up_to``) and its lock
        node (this tree's, locked)."""
        up_to = check_up_to(up_to)
        check_flag("chunked", chunked)
        row, _, _ = check_release(req, self.req_to_token_pool, up_to)
        self._check_unlock(req.last_node)
        kv = self.req_to_token_pool.read(row, 0, up_to)
        key, aligned = self._req_key(req, up_to), self._cached_len(up_to)
        self._insert_checkpoint(req, key, kv[:aligned], chunked)
        prompt_tokens = min(up_to, len(req.origin_input_ids))
        prompt = self._cached_len(prompt_tokens)
        if 0 < prompt < aligned:
            self.insert(self._req_key(req, prompt_tokens), kv[:prompt], priority=req.priority + 1,
                        inserted_len=prompt)  # fmt: skip
        protected = req.cache_protected_len
        match = self.match_prefix(key)
        new_indices = match.device_indices
        self.req_to_token_pool.write(
            (row, slice(protected, len(new_indices))), new_indices[protected:]
        )
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = len(new_indices)
        req.last_node = match.last_device_node
        out: list[int] = new_indices + kv[len(new_indices) :]
        return out

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: list[int] | None = None
    ) -> None:
        """Hand a finished request's committed KV to the tree (or free it), then unlock its node.
        Checked before any change: ``is_insert`` a bool, the request
        (:func:`~kvpool.reference.radix.checks.check_release`), its lock node (this tree's,
        locked) and ``row_read`` (integers, one per committed token).

        ``kv = row[:committed]``. ``rules.release_path == "finished_req"`` (SGLang 0.5.16): with
        insert, insert the page-aligned part, free the duplicates
        ``kv[cache_protected_len:new_prefix_len]``, then (a second ``free``, as SGLang) the
        unaligned tail ``kv[aligned:committed]`` (its whole page); without, free
        ``kv[cache_protected_len:aligned]``, then the tail; disabled, one free of
        ``kv[cache_protected_len:committed]``. ``"checkpoint"`` (SGLang 0.5.23): with insert,
        :meth:`checkpoint` up to ``committed``; then (``free_kv_row``) one ``free_segment`` of
        ``row[cache_protected_len:committed]``, disabled or not. Over-allocation past
        ``ceil_align(committed)`` is the caller's (``release_kv_cache``).

        ``row_read``: ``row[:committed]`` as the caller already read it, used instead of a read
        of the row (under ``"checkpoint"`` only without insert: the checkpoint rewrites the
        row); the twin's lifecycle passes its batch read, this lifecycle passes none."""
        check_flag("is_insert", is_insert)
        _, committed, _ = check_release(req, self.req_to_token_pool)
        self._check_unlock(req.last_node)
        if row_read is not None:
            row_read = int_list("row_read", row_read)
            check_row_read_len(len(row_read), committed)
        assert req.req_pool_idx is not None
        if self.rules.release_path == "checkpoint":
            rewritten = is_insert and not self.disable
            if rewritten:
                self.checkpoint(req, committed)
            if row_read is not None and not rewritten:
                kv = list(row_read[req.cache_protected_len : committed])
            else:
                kv = self.req_to_token_pool.read(
                    req.req_pool_idx, req.cache_protected_len, committed
                )
            self.token_to_kv_pool_allocator.free_segment(kv, req.cache_protected_len)
            self.dec_lock_ref(req.last_node)
            return
        if row_read is not None:
            kv = list(row_read[:committed])
        else:
            kv = self.req_to_token_pool.read(req.req_pool_idx, 0, committed)
        free = self.token_to_kv_pool_allocator.free
        if self.disable:
            free(kv[req.cache_protected_len : committed])
            return
        aligned = self._cached_len(committed)
        if is_insert:
            new_prefix_len = self._insert_req(
                req, self._req_key(req, committed), kv[:aligned], chunked=False
            )
            self._free_tree_slots(
                kv[req.cache_protected_len : new_prefix_len], req.cache_protected_len
            )
        else:
            free(kv[req.cache_protected_len : aligned])
        free(kv[aligned:committed])
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: list[int] | None = None
    ) -> None:
        """Between prefill chunks: insert ``fill_ids`` (page-aligned; hits by
        ``rules.hit_count``: a ``chunked`` insert counts none, or only past
        ``cache_inserted_len``), free the duplicates, re-match, rewrite
        ``row[cache_protected_len:len(new_indices)]`` with the tree's slots, move the lock to
        the new last node and set ``prefix_indices``/``cache_protected_len``. The row stays.
        ``rules.release_path == "checkpoint"``: the same through :meth:`checkpoint` (its
        duplicate free follows ``rules.tree_free``; the prompt re-insert never applies, a chunk
        being part of the prompt). ``row_read``: ``row[:len(fill_ids)]`` as the caller already
        read it, used instead of a read of the row (not under ``"checkpoint"``). Checked before
        any change: ``chunked`` a bool, the request up to ``len(fill_ids)``, its lock node and
        ``row_read``, as :meth:`cache_finished_req`."""
        check_flag("chunked", chunked)
        row, _, _ = check_release(req, self.req_to_token_pool, fill_len(req))
        self._check_unlock(req.last_node)
        if row_read is not None:
            row_read = int_list("row_read", row_read)
            check_row_read_len(len(row_read), len(req.fill_ids))
        tokens = list(req.fill_ids)
        if self.rules.release_path == "checkpoint" and not self.disable:
            req.prefix_indices = self.checkpoint(req, len(tokens), chunked)
            return
        if row_read is not None:
            kv = list(row_read[: len(tokens)])
        else:
            kv = self.req_to_token_pool.read(row, 0, len(tokens))
        if self.disable:
            req.prefix_indices = kv
            return
        aligned = self._cached_len(len(tokens))
        key = self._req_key(req, len(tokens))
        new_prefix_len = self._insert_req(req, key, kv[:aligned], chunked=chunked)
        self.token_to_kv_pool_allocator.free(kv[req.cache_protected_len : new_prefix_len])
        match = self.match_prefix(key)
        new_indices = match.device_indices
        protected = req.cache_protected_len
        self.req_to_token_pool.write(
            (row, slice(protected, len(new_indices))), new_indices[protected:]
        )
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.prefix_indices = new_indices + kv[len(new_indices) :]
        req.cache_protected_len = len(new_indices)
        req.last_node = match.last_device_node

    # ----------------------------------------------------------------- views
    def pretty_print(self) -> str:
        """The tree, one node a line (id, key/value preview, lock_ref, access time)."""
        return pretty_print_tree(self)

    def snapshot(self) -> TreeSnapshot:
        """Plain snapshot; nodes in BFS order by child insertion order, root first."""
        return snapshot_tree(self)


__all__ = ["RadixCache", "logical_clock"]

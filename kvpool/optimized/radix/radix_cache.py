"""The optimized twin's ``RadixCache``: SGLang's prefix tree, built for long prompts and big trees.

Same API, node ids, results and eviction order as
:class:`kvpool.reference.radix.radix_cache.RadixCache` (see the tree contract in its docstring).
What differs is how the work is done:

- keys are int32/int64 token arrays (:mod:`kvpool.optimized.key_match`; a list key is packed into
  one once), compared with one vectorised ``!=`` per node on the path, never token by token;
- values are int64 tensors; a match concatenates the path's values once (on the CPU through
  the nodes' numpy views, ``np.concatenate``, a fraction of ``torch.cat``'s per-call cost);
- children are a dict keyed by the first token id (page size 1) or the tuple of the first page of
  token ids (page size > 1), prefixed by the namespace (``extra_key``) under the root;
- eviction pops a persistent heap of ``(priority key ending with node_id, node)`` entries, acting
  on an entry only if its node is still an unlocked leaf with that priority. A node whose
  candidacy or priority may have changed is queued (by id) and pushed when the next ``evict``
  starts; inserts and matches never touch the heap, which is compacted (never rebuilt per call)
  once stale entries outnumber the nodes;
- the release path (``cache_finished_req`` / ``cache_unfinished_req`` / ``checkpoint``) takes a
  row already read by the caller (``row_read``) and skips the rewrite of a row that would change
  no slot;
- ``is_eagle``: the bigram codes of a key come from one vectorised shift and ``|``.

Units: sizes and lengths are tokens; values are slot ids.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import torch

from kvpool.constants import floor_align, is_power_of_two
from kvpool.errors import ConfigError, InvalidArgumentError, LockError, PageSizeError
from kvpool.optimized.key_match import child_key, matched_tokens
from kvpool.optimized.options import TwinOptions, options_of
from kvpool.optimized.radix.checks import check_slots_held, row_read_arg, tree_slots
from kvpool.optimized.radix.tree_view import pretty_print_tree, snapshot_tree
from kvpool.optimized.radix_key import (
    ChildKey,
    MatchResult,
    PathSlots,
    RadixKey,
    TreeNode,
    as_slots,
    bigram_key,
    join_slots,
    req_key,
)
from kvpool.optimized.req import Req
from kvpool.protocols.pools import ReqToTokenPoolProtocol, SegmentAllocatorProtocol
from kvpool.reference.radix.checks import (  # pure host checks, shared
    check_count,
    check_flag,
    check_insert_flags,
    check_key,
    check_release,
    check_up_to,
    fill_len,
)
from kvpool.reference.radix.evict_policy import PriorityKey, get_priority_fn
from kvpool.reference.radix.radix_cache import hit_floor, logical_clock  # pure helpers, shared
from kvpool.reference.radix_key import cached_len, tree_slot_limit
from kvpool.rules import Rules
from kvpool.snapshot import TreeSnapshot

_EMPTY = torch.empty(0, dtype=torch.int64)


class RadixCache:
    """Prefix cache over ``token_to_kv_pool_allocator``'s slots (``disable=True``: no tree).

    ``clock`` is read exactly once by each ``match_prefix`` / ``insert``; every node the operation
    touches is stamped with that value.

    ``options``: the twin's :class:`~kvpool.optimized.options.TwinOptions`; a tree built alone
    over collaborators and given none runs as its allocator does (:func:`~kvpool.optimized.options.
    options_of`)."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPoolProtocol[torch.Tensor],
        token_to_kv_pool_allocator: SegmentAllocatorProtocol[torch.Tensor],
        page_size: int,
        disable: bool = False,
        eviction_policy: str = "lru",
        clock: Callable[[], float] | None = None,
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
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
        self.priority_fn = get_priority_fn(self.eviction_policy)
        self.clock: Callable[[], float] = clock if clock is not None else logical_clock()
        self.options = options if options is not None else options_of(token_to_kv_pool_allocator)
        self.device = self.options.device
        self._cpu = self.device.type == "cpu"
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Drop the whole tree (without freeing its slots) and start the node ids again at 0."""
        self._next_id = 0
        self.root_node = self._new_node(RadixKey([]), _EMPTY.to(self.device), None, 0.0)
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self._num_nodes = 1
        self._heap: list[tuple[PriorityKey, TreeNode]] = []
        self._dirty: dict[int, TreeNode] = {}

    def _new_node(
        self, key: RadixKey, value: torch.Tensor, parent: TreeNode | None, now: float
    ) -> TreeNode:
        node = TreeNode(self._next_id, key, value, parent, now)
        self._next_id += 1
        return node

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes."""
        return self.evictable_size_

    def protected_size(self) -> int:
        """Tokens in locked nodes (``lock_ref > 0``)."""
        return self.protected_size_

    def total_size(self) -> int:
        """Tokens in the tree (every non-root node's key length)."""
        return self.evictable_size_ + self.protected_size_

    # ------------------------------------------------------------------ walk helpers
    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Split ``child`` at token ``at`` (page-aligned, ``0 < at < len``): a new upper node with
        the next id takes ``child``'s place under its parent; ``child`` keeps its id and becomes
        the lower half. Lock count, hits and priority are copied to the upper node, which is
        created at the walk's time (``child`` was just stamped with it)."""
        parent = child.parent
        assert parent is not None
        now = child.last_access_time
        upper = self._new_node(child.key[:at], child.value[:at], parent, now)
        upper.hit_count = child.hit_count
        upper.priority = child.priority
        upper.lock_ref = child.lock_ref
        upper.child_key = child.child_key
        parent.children[child.child_key] = upper  # same dict slot: insertion order kept
        child.key = child.key[at:]
        child.arr = child.key.array
        child.value = child.value[at:]
        child.parent = upper
        child.child_key = child_key(child.arr, 0, self.page_size)
        upper.children[child.child_key] = child
        self._num_nodes += 1
        return upper

    def _walk(
        self, key: RadixKey, n: int, now: float, priority: int | None, floor: float
    ) -> tuple[list[PathSlots], TreeNode, int, ChildKey | None]:
        """Walk the first ``n`` tokens of ``key`` (``n`` page-aligned) from the root, splitting
        where the match ends inside a node and stamping every node on the matched path. An
        insert (``priority`` not None) also raises each path node's priority to ``priority`` and
        counts a hit on each path node that ends past ``floor`` tokens (:func:`hit_floor`); a
        match (None) changes neither. Returns the matched values (a match's only: an insert
        drops them, so it takes no numpy view per node), the deepest matched node, the matched
        length (tokens) and the child key looked up last (the dict key a new leaf below that
        node would take)."""
        ps = self.page_size
        node = self.root_node
        values: list[PathSlots] = []  # numpy views on the CPU (see TreeNode.vnp), else tensors
        cpu = self._cpu
        pos = 0
        if n == 0:
            return values, node, 0, None
        ck: ChildKey = (key.extra_key, key.plain_child_key(ps))
        child = node.children.get(ck)
        if child is None:  # a miss at the root: a list key is never packed into an array
            return values, node, 0, ck
        arr = key.array
        while child is not None:
            child.last_access_time = now  # stamped before a split: both halves carry now
            carr = child.arr
            m = len(carr)
            matched = matched_tokens(carr, arr, pos, n)
            if ps > 1:
                matched = (matched // ps) * ps
            if matched < m:
                lower = child
                child = self._split(lower, matched)
                if not lower.children and lower.lock_ref == 0:
                    self._push(lower)  # the lower half's access time changed
            if priority is not None:
                if pos + matched > floor:
                    child.hit_count += 1
                if priority > child.priority:
                    child.priority = priority
            if priority is None:
                values.append(child.vnp if cpu else child.value)
            node = child
            pos += matched
            if pos >= n:
                return values, node, pos, None
            ck = child_key(arr, pos, ps)
            if matched < m:  # split: the new upper node has one child, and it is not ck
                return values, node, pos, ck
            child = node.children.get(ck)
        return values, node, pos, ck

    def _tree_key(self, key: RadixKey) -> RadixKey:
        """The key the tree stores for token key ``key``: its bigrams under ``is_eagle``."""
        return bigram_key(key) if self.is_eagle else key

    def _cached_len(self, num_tokens: int) -> int:
        return cached_len(num_tokens, self.page_size, self.is_eagle)

    def _req_key(self, req: Req, num_tokens: int) -> RadixKey:
        """The token key of what the tree caches of the request's first ``num_tokens`` tokens
        (see the reference)."""
        cached = self._cached_len(num_tokens)
        return req_key(req, cached + self.is_eagle if cached else 0)

    def _refresh(self, node: TreeNode) -> None:
        """``node``'s priority may have changed: an unlocked leaf gets a current heap entry."""
        if not node.children and node.lock_ref == 0 and node is not self.root_node:
            self._push(node)

    # ------------------------------------------------------------------ public tree API
    def match_prefix(self, key: RadixKey) -> MatchResult:
        """Longest cached page-aligned prefix of ``key``; see the module docstring.
        InvalidArgumentError unless ``key`` is a RadixKey."""
        check_key(key, RadixKey)
        key = self._tree_key(key)
        aligned = floor_align(len(key), self.page_size)
        if self.disable or aligned == 0:
            return MatchResult(_EMPTY.to(self.device), self.root_node, self.root_node)
        now = self.clock()
        values, node, _, _ = self._walk(key, aligned, now, None, 0.0)
        self._refresh(node)
        indices = node.value if len(values) == 1 else join_slots(values, self.device)
        return MatchResult(indices, node, node)

    def insert(
        self,
        key: RadixKey,
        value: torch.Tensor | None = None,
        priority: int = 0,
        chunked: bool = False,
        inserted_len: int | None = None,
    ) -> int:
        """Insert the page-aligned part of ``key`` with slots ``value``; returns the length (tokens)
        already in the tree. Frees nothing. Counts a hit on the matched path and the new leaf
        unless ``chunked``; given ``inserted_len``, only on the nodes ending past it.

        Ownership: the new leaf keeps views of ``key``'s array and of ``value`` (no copy, as in
        SGLang); the caller must not modify them afterwards. ``cache_finished_req`` and
        ``cache_unfinished_req`` pass fresh copies read from the table.

        Checked before any change, as the reference: the key and the scalars (both modes), the
        slots' dtype and shape (both modes), their range and distinctness (checked mode, or
        always for host values: :func:`~kvpool.optimized.radix.checks.tree_slots`). Under
        ``is_eagle`` the tree stores ``key``'s bigrams at the first slots of ``value``."""
        check_key(key, RadixKey)
        check_insert_flags(priority, chunked, inserted_len)
        tokens, key = key, self._tree_key(key)
        if value is not None:
            limit = tree_slot_limit(self.token_to_kv_pool_allocator)
            value = tree_slots(value, len(key), self.device, self.options.checked, limit)
            if self.options.checked:
                aligned = floor_align(len(key), self.page_size)
                check_slots_held(self.token_to_kv_pool_allocator, value[:aligned])
        else:  # the token ids stand in for slots in tests only
            value = as_slots(tokens.array, self.device)
            if value.shape[0] < len(key):
                raise InvalidArgumentError(f"{len(value)} slots for a key of {len(key)} tokens")
        if self.disable:
            return 0
        aligned = floor_align(len(key), self.page_size)
        if aligned == 0:
            return 0
        now = self.clock()
        floor = hit_floor(chunked, inserted_len)
        _, node, pos, ck = self._walk(key, aligned, now, priority, floor)
        if pos < aligned:
            leaf_key = RadixKey.from_array(key.array[pos:aligned], key.extra_key)
            leaf = self._new_node(leaf_key, value[pos:aligned], node, now)
            leaf.priority = priority
            leaf.hit_count = 1 if aligned > floor else 0
            assert ck is not None  # a walk that stops short of the key names the missing child
            leaf.child_key = ck  # the key the walk looked up and did not find
            node.children[ck] = leaf
            self._num_nodes += 1
            self.evictable_size_ += aligned - pos
            self._push(leaf)
        else:
            self._refresh(node)
        return pos

    def _path(self, node: TreeNode) -> list[TreeNode]:
        """``node`` .. the root's child; raises LockError for a detached node."""
        path: list[TreeNode] = []
        root = self.root_node
        while node is not root:
            if node.parent is None:
                raise LockError(f"node {node.node_id} is not in the tree")
            path.append(node)
            node = node.parent
        return path

    def _check_node(self, node: object) -> list[TreeNode]:
        """``node``'s path to the root (empty for None): InvalidArgumentError unless it is a
        TreeNode, LockError when it is not in a tree."""
        if node is None:
            return []
        if not isinstance(node, TreeNode):
            raise InvalidArgumentError(f"node must be a TreeNode or None, got {node!r}")
        return self._path(node)

    def _check_unlock(self, node: object) -> None:
        """What :meth:`dec_lock_ref` of ``node`` checks, before a release changes anything."""
        path = self._check_node(node)
        if self.disable:
            return
        bad = [n.node_id for n in path if n.lock_ref <= 0]
        if bad:
            raise LockError(f"lock_ref would go negative on nodes {bad}")

    def inc_lock_ref(self, node: TreeNode | None) -> int:
        """Lock ``node`` and its ancestors; returns the change of the evictable size (tokens).
        InvalidArgumentError for a non-node, LockError for a detached one."""
        path = self._check_node(node)
        if self.disable or node is None:
            return 0
        delta = 0
        for n in path:
            if n.lock_ref == 0:
                size = len(n)
                self.evictable_size_ -= size
                self.protected_size_ += size
                delta -= size
            n.lock_ref += 1
        return delta

    def dec_lock_ref(self, node: TreeNode | None) -> int:
        """Unlock ``node`` and its ancestors; returns the change of the evictable size (tokens).
        Raises :class:`LockError` (changing nothing) if a count would go negative or the node
        is detached; InvalidArgumentError for a non-node."""
        path = self._check_node(node)
        if self.disable or node is None:
            return 0
        bad = [n.node_id for n in path if n.lock_ref <= 0]
        if bad:
            raise LockError(f"lock_ref would go negative on nodes {bad}")
        delta = 0
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                size = len(n)
                self.evictable_size_ += size
                self.protected_size_ -= size
                delta += size
                if not n.children:
                    self._push(n)
        return delta

    # ------------------------------------------------------------------ eviction
    def _push(self, node: TreeNode) -> None:
        """``node`` may be a candidate with a new priority: queue it for the heap (deduplicated
        by id; pushed with its priority of that moment when the next ``evict`` starts)."""
        self._dirty[node.node_id] = node

    def _flush(self) -> None:
        """Give every queued node that is still a candidate a current heap entry."""
        heap = self._heap
        priority = self.priority_fn
        for node in self._dirty.values():
            if node.parent is not None and not node.children and node.lock_ref == 0:
                heapq.heappush(heap, (priority(node), node))
        self._dirty.clear()

    def _is_current(self, entry: tuple[PriorityKey, TreeNode]) -> bool:
        node = entry[1]
        return (
            node.parent is not None
            and not node.children
            and node.lock_ref == 0
            and entry[0] == self.priority_fn(node)
        )

    def _compact(self) -> None:
        """Drop stale entries (every candidate keeps its current entry)."""
        self._heap = [e for e in self._heap if self._is_current(e)]
        heapq.heapify(self._heap)

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves by policy until ``num_tokens`` tokens are freed or nothing is
        evictable; frees each node's slots with one allocator ``free``. Returns tokens freed.
        InvalidArgumentError unless ``num_tokens`` is a count."""
        num_tokens = check_count("num_tokens", num_tokens)
        if self.disable or num_tokens == 0:
            return 0
        self._flush()
        if len(self._heap) > 2 * self._num_nodes + 64:
            self._compact()
        heap = self._heap
        evicted = 0
        root = self.root_node
        while evicted < num_tokens and heap:
            entry = heapq.heappop(heap)
            if not self._is_current(entry):
                continue
            node = entry[1]
            parent = node.parent
            assert parent is not None
            self._free_tree_slots(node.value, 0)
            del parent.children[node.child_key]
            node.parent = None
            size = len(node)
            self.evictable_size_ -= size
            self._num_nodes -= 1
            evicted += size
            if parent is not root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (self.priority_fn(parent), parent))
        return evicted

    # ------------------------------------------------------------------ release path
    def _read_row(self, row: int, stop: int) -> torch.Tensor:
        """``req_to_token[row, :stop]`` as int64 slots."""
        kv: torch.Tensor = self.req_to_token_pool.read(row, 0, stop)
        return kv.to(torch.int64)

    def _free_tree_slots(self, slots: torch.Tensor, start_pos: int) -> None:
        """Return slots the tree owned (an evicted node's, a finished request's duplicates
        starting at column ``start_pos``) as ``rules.tree_free`` says: ``free`` or SGLang
        0.5.23's ``free_segment``."""
        if self.rules.tree_free == "segment":
            self.token_to_kv_pool_allocator.free_segment(slots, start_pos)
        else:
            self.token_to_kv_pool_allocator.free(slots)

    def _row_or_read(self, row: int, stop: int, row_read: torch.Tensor | None) -> torch.Tensor:
        """``row_read`` when the caller read ``row[:stop]`` already (checked by
        :meth:`_check_row_read`), else one read of it."""
        if row_read is not None:
            return row_read
        return self._read_row(row, stop)

    def _check_row_read(self, row_read: object, stop: int) -> torch.Tensor | None:
        """A caller's row read of ``stop`` columns, as an int64 tensor on the device
        (:func:`~kvpool.optimized.radix.checks.row_read_arg`)."""
        return row_read_arg(row_read, stop, self.device)

    def _insert_req(self, req: Req, key: RadixKey, value: torch.Tensor, chunked: bool) -> int:
        """Insert ``key`` for ``req``, counting hits as ``rules.hit_count`` says (``chunked``, or
        past ``req.cache_inserted_len``, which then rises to the key's length)."""
        if self.rules.hit_count == "chunked":
            return self.insert(key, value, priority=req.priority, chunked=chunked)
        done = self.insert(key, value, priority=req.priority, inserted_len=req.cache_inserted_len)
        req.cache_inserted_len = max(req.cache_inserted_len, self._cached_len(len(key)))
        return done

    def _insert_checkpoint(
        self, req: Req, key: RadixKey, value: torch.Tensor, chunked: bool
    ) -> int:
        """:meth:`checkpoint`'s insert and its duplicates' free: one free in the legacy tree (see
        the reference). Returns the tokens of ``key`` the tree held already."""
        protected = req.cache_protected_len
        cached = self._insert_req(req, key, value, chunked)
        self._free_tree_slots(value[protected:cached], protected)
        return cached

    def checkpoint(self, req: Req, up_to: int, chunked: bool = False) -> torch.Tensor:
        """SGLang 0.5.23's ``checkpoint`` (see the reference): insert, re-insert a shorter
        page-aligned prompt with ``priority + 1`` and no hit, free the duplicates, match again,
        rewrite the row, move ``cache_protected_len`` and the lock. Returns ``row[:up_to]``
        as it is afterwards (int64). Checked before any change as the reference."""
        up_to = check_up_to(up_to)
        check_flag("chunked", chunked)
        row, _, _ = check_release(req, self.req_to_token_pool, up_to)
        self._check_unlock(req.last_node)
        kv = self._read_row(row, up_to)
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
        num_new = len(new_indices)
        self.req_to_token_pool.write((row, slice(protected, num_new)), new_indices[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = num_new
        req.last_node = match.last_device_node
        return torch.cat((new_indices, kv[num_new:]))

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: torch.Tensor | None = None
    ) -> None:
        """Hand a finished request's committed KV to the tree (or free it), then unlock its node.

        ``kv = row[:committed]``. ``rules.release_path == "finished_req"``: with insert, insert
        the page-aligned part, free the duplicates ``kv[cache_protected_len:new_prefix_len]``,
        then the unaligned tail ``kv[aligned:committed]`` (two frees, as the reference); without,
        free ``kv[cache_protected_len:aligned]``, then the tail; disabled, one free of
        ``kv[cache_protected_len:committed]``. ``"checkpoint"``: with insert, :meth:`checkpoint`
        up to ``committed``; then one ``free_segment`` of ``row[cache_protected_len:
        committed]``, disabled or not.

        ``row_read``: ``row[:committed]`` as the caller already read it (int64, 1-D, on the
        device: the lifecycle reads a finish batch's rows in one gather), used instead of a read
        of the row (under ``"checkpoint"`` only without insert: the checkpoint rewrites the
        row). The request's slots are then views of it: with the radix cache, the release of a
        request launches no tensor operation, and inside a free group its frees are buffered.
        Checked before any change as the reference (host fields, and ``row_read``'s
        metadata and length)."""
        check_flag("is_insert", is_insert)
        _, committed, _ = check_release(req, self.req_to_token_pool)
        self._check_unlock(req.last_node)
        row_read = self._check_row_read(row_read, committed)
        assert req.req_pool_idx is not None
        if self.rules.release_path == "checkpoint":
            rewritten = is_insert and not self.disable
            if rewritten:
                self.checkpoint(req, committed)
            protected = req.cache_protected_len
            kv = self._row_or_read(req.req_pool_idx, committed, None if rewritten else row_read)
            self.token_to_kv_pool_allocator.free_segment(kv[protected:], protected)
            self.dec_lock_ref(req.last_node)
            return
        kv = self._row_or_read(req.req_pool_idx, committed, row_read)
        free = self.token_to_kv_pool_allocator.free
        if self.disable:
            free(kv[req.cache_protected_len : committed])
            return
        aligned = self._cached_len(committed)
        if is_insert:
            key = self._req_key(req, committed)
            new_prefix_len = self._insert_req(req, key, kv[:aligned], chunked=False)
            self._free_tree_slots(
                kv[req.cache_protected_len : new_prefix_len], req.cache_protected_len
            )
        else:
            free(kv[req.cache_protected_len : aligned])
        free(kv[aligned:committed])
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: torch.Tensor | None = None
    ) -> None:
        """Between prefill chunks: insert ``fill_ids`` (page-aligned; hits by
        ``rules.hit_count``), free the duplicates, re-match, rewrite
        ``row[cache_protected_len:len(new_indices)]`` with the tree's slots, move the lock to
        the new last node and set ``prefix_indices``/``cache_protected_len``
        (``rules.release_path == "checkpoint"``: through :meth:`checkpoint`).

        ``row_read``: ``row[:len(fill_ids)]`` as the caller already read it (int64, 1-D, on the
        device), used instead of a read of the row (not under ``"checkpoint"``). When the tree
        held nothing of the chunk past ``cache_protected_len`` (no duplicates; the usual case)
        and the re-match covers the whole aligned chunk, the tree's slots past the protected
        prefix are this request's own: the row already holds them, so the reference's rewrite
        would change no slot and is skipped, and ``prefix_indices`` is ``kv`` itself (the same
        values as the reference's join): neither launches anything. Checked before any change
        as the reference."""
        check_flag("chunked", chunked)
        num_tokens = fill_len(req)
        row, _, _ = check_release(req, self.req_to_token_pool, num_tokens)
        self._check_unlock(req.last_node)
        row_read = self._check_row_read(row_read, num_tokens)
        if self.rules.release_path == "checkpoint" and not self.disable:
            req.prefix_indices = self.checkpoint(req, num_tokens, chunked)
            return
        kv = self._row_or_read(row, num_tokens, row_read)
        if self.disable:
            req.prefix_indices = kv
            return
        aligned = self._cached_len(num_tokens)
        key = self._req_key(req, num_tokens)
        new_prefix_len = self._insert_req(req, key, kv[:aligned], chunked=chunked)
        self.token_to_kv_pool_allocator.free(kv[req.cache_protected_len : new_prefix_len])
        match = self.match_prefix(key)
        new_indices = match.device_indices
        protected = req.cache_protected_len
        num_new = len(new_indices)
        own = new_prefix_len == protected and num_new == aligned  # no rewrite changes a slot
        if not own:
            self.req_to_token_pool.write((row, slice(protected, num_new)), new_indices[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.prefix_indices = kv if own else torch.cat((new_indices, kv[num_new:]))
        req.cache_protected_len = num_new
        req.last_node = match.last_device_node

    # ------------------------------------------------------------------ views
    def pretty_print(self) -> str:
        """The tree, one node a line (id, key/value preview, lock_ref, access time)."""
        return pretty_print_tree(self)

    def snapshot(self) -> TreeSnapshot:
        """Plain snapshot; nodes in BFS order by child insertion order, root first."""
        return snapshot_tree(self)


__all__ = ["RadixCache"]

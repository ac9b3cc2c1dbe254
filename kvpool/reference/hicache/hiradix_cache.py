"""``HiRadixCache``: the radix cache with a host tier (SGLang 0.5.16's ``HiRadixCache``).

Units: sizes are tokens; ``value`` holds device slots, ``host_value`` host slots. Node states
are described in :mod:`~kvpool.reference.hicache.tree_node`; ``evictable_size`` / ``protected_size``
count device tokens only (a host-only node is never locked).

- Write policies: ``write_through`` (a node is written to host when an insert counts its first
  hit), ``write_through_selective`` (its second hit), ``write_back`` (inserts write nothing;
  eviction writes). A write-through write needs the parent backed up (backups form a prefix
  from the root), reserves host slots (evicting host-only leaves once if full), sets
  ``host_value`` at once, and locks the node until its acknowledgement arrives
  (:meth:`writing_check`), so its device copy cannot be evicted while the copy is in flight.
- ``evict(n)``: device leaves (unlocked, every child host-only) by policy. A backed-up node
  keeps its key and becomes host-only (its device slots freed); one without a backup is deleted
  (write-through) or, under write-back, written to host first (the eviction waits for every
  write in flight, then frees the device slots) or, when the host is full, dropped with its
  host-only subtree unless a host copy there is pinned.
- ``evict_host(n)``: host-only leaves that are not pinned, by policy; the node leaves the tree.
- ``load_back(node)``: restore the host-only nodes above ``node`` (up to the first device node,
  which is locked meanwhile) into newly allocated device slots (evicting once if needed),
  unless fewer than ``load_back_threshold`` tokens or more than ``mem_quota`` (plus what the
  lock took) would move; the restored node is locked until the load's acknowledgement
  (:meth:`loading_check`), which also copies the content.
- ``match_prefix`` also reports ``host_hit_length`` (tokens in host-only nodes at the end of the
  match) and ``last_host_node`` (the deepest backed-up matched node; the root counts).
- Storage prefetches: :class:`~kvpool.reference.hicache.prefetch.StoragePrefetch`.

The tree owns three collaborators, each holding a typed view of the tree:
``host_eviction`` (:class:`~kvpool.reference.hicache.evict.HostEviction`: ``evict`` and
``evict_host``), ``storage_prefetch`` (:class:`~kvpool.reference.hicache.prefetch.
StoragePrefetch`) and ``unified_tier`` (:class:`~kvpool.reference.hicache.unified_tier.
UnifiedHostTier`).

Under ``Rules.hicache_host_tier == "unified"`` (SGLang 0.5.23's host tier inside
``UnifiedRadixCache``) the differences are in :mod:`~kvpool.reference.hicache.unified_tier`, and
here: writes are queued and issued together by the next ``writing_check``; ``insert`` frees the
caller's duplicate device slots itself (one free per matched node) and counts matched host-only
tokens (and a hit on them) in its result; ``match_prefix``'s ``last_host_node`` is the deepest
matched node; device slots go back through ``free_segment`` when ``Rules.tree_free ==
"segment"``; an insert raises the priority of the matched nodes only (a split node's lower half
keeps its own; 0.5.16 raised the node before cutting it, so both halves).
"""

from __future__ import annotations

from collections.abc import Callable

from kvpool.constants import ROOT_PRIORITY
from kvpool.errors import ConfigError
from kvpool.host_checks import as_bool, as_count
from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.reference.hicache.args import (
    backup_args,
    check_instance,
    check_lockable,
    check_release_request,
    check_row_read,
    insert_args,
    insert_slots,
    optional_count,
    tree_node,
)
from kvpool.reference.hicache.cache_controller import HiCacheController, PrefetchOperation
from kvpool.reference.hicache.evict import HostEviction
from kvpool.reference.hicache.prefetch import StoragePrefetch
from kvpool.reference.hicache.tree_node import HiTreeNode, as_hi
from kvpool.reference.hicache.tree_view import hi_tree_snapshot, host_tier_snapshot
from kvpool.reference.hicache.unified_tier import UnifiedHostTier
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix.radix_cache import RadixCache, hit_floor
from kvpool.reference.radix.tree_view import bfs_nodes
from kvpool.reference.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.reference.req import Req
from kvpool.rules import Rules
from kvpool.snapshot import HostTierSnapshot, PrefetchSnapshot, TreeSnapshot

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")


class HiRadixCache(RadixCache):
    """Prefix cache over device slots with host backups in ``token_to_kv_pool_host`` (see the
    module docstring)."""

    root_node: HiTreeNode

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: BaseTokenToKVPoolAllocator,
        page_size: int,
        token_to_kv_pool_host: HostPoolProtocol[list[int]],
        disable: bool = False,
        eviction_policy: str = "lru",
        clock: Callable[[], float] | None = None,
        write_policy: str = "write_through",
        load_back_threshold: int = 10,
        prefetch_threshold: int = 256,
        enable_storage: bool = False,
        *,
        rules: Rules | None = None,
        is_eagle: bool = False,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ConfigError(f"unknown write_policy {write_policy!r}; known: {WRITE_POLICIES}")
        if token_to_kv_pool_host.page_size != page_size:
            raise ConfigError("the host pool's page size differs from the cache's")
        self.token_to_kv_pool_host = token_to_kv_pool_host
        self.cache_controller = HiCacheController(
            token_to_kv_pool_allocator, token_to_kv_pool_host, page_size, write_policy
        )
        self.write_policy = write_policy
        self.write_through_threshold = 1 if write_policy == "write_through" else 2
        self.load_back_threshold = load_back_threshold
        self.prefetch_threshold = prefetch_threshold
        self.enable_storage = enable_storage
        resolved = rules if rules is not None else Rules()
        self.unified = resolved.hicache_host_tier == "unified"
        self.cache_controller.segment_frees = self.unified and resolved.tree_free == "segment"
        self.cache_controller.acks_at_drain = self.unified
        # the collaborators exist before the tree's first reset, which resets them
        self.host_eviction = HostEviction(self)
        self.storage_prefetch = StoragePrefetch(self)
        self.unified_tier = UnifiedHostTier(self)
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size, disable,
                         eviction_policy, clock, rules=rules, is_eagle=is_eagle)  # fmt: skip

    def reset(self) -> None:
        """Forget the tree, every transfer and prefetch, and clear the host pool."""
        self.cache_controller.reset()
        self.token_to_kv_pool_host.clear()
        self.ongoing_write_through: dict[int, tuple[HiTreeNode, list[HiTreeNode]]] = {}
        self.ongoing_load_back: dict[int, HiTreeNode] = {}
        self.storage_prefetch.reset()
        self.unified_tier.reset()
        super().reset()
        self.root_node.host_value = []
        if self.unified:  # SGLang's floor, raised by every insert (:meth:`insert`)
            self.root_node.priority = ROOT_PRIORITY

    @property
    def frees_duplicates(self) -> bool:
        """Whether ``insert`` frees the caller's duplicate device slots itself (unified rules)."""
        return self.unified

    def _new_node(self, key: RadixKey, value: list[int], parent: TreeNode | None, now: float,
                  priority: int = 0) -> HiTreeNode:  # fmt: skip
        node = HiTreeNode(self._next_id, key, value, parent, now, priority)
        self._next_id += 1
        return node

    def _device_nodes(self) -> list[HiTreeNode]:
        return [as_hi(n) for n in bfs_nodes(self.root_node)[1:] if not as_hi(n).evicted]

    def total_size(self) -> int:
        """Device tokens in the tree (host-only nodes excluded)."""
        return sum(len(n.key) for n in self._device_nodes())

    # ----------------------------------------------------------------- argument checks
    def _tree_node(self, name: str, node: object) -> HiTreeNode:
        """``node`` as a node of this tree (InvalidArgumentError otherwise)."""
        return tree_node(name, node, self.root_node, HiTreeNode)

    def _check_request(self, req: object, up_to: int | None = None) -> None:
        """:func:`~kvpool.reference.hicache.args.check_release_request` on this tree, capped at
        the row's width."""
        width = self.req_to_token_pool.max_context_len
        check_release_request("req", req, self.root_node, HiTreeNode, up_to, width)

    # ----------------------------------------------------------------- split / match / insert
    def _split_node(self, child: TreeNode, split_len: int) -> HiTreeNode:
        """As the radix cache's split; the halves share the device or host state, both host
        values are cut at ``split_len``, and a pending write covers both halves. The upper half
        starts with no host pin (as SGLang 0.5.16; under the unified rules it takes the host
        locks of the lower half's load-backs and prefetches, as 0.5.23's lock receipts extend to
        both halves)."""
        low = as_hi(child)
        upper = as_hi(super()._split_node(low, split_len))
        upper.evicted = low.evicted
        if low.host_value is not None:
            upper.host_value = low.host_value[:split_len]
            low.host_value = low.host_value[split_len:]
        ack = low.write_through_pending_id
        if ack is not None and ack in self.ongoing_write_through:
            lock_node, nodes = self.ongoing_write_through[ack]
            if low in nodes:
                i = nodes.index(low)
                nodes[i : i + 1] = [upper, low]
                upper.write_through_pending_id = ack
                self.ongoing_write_through[ack] = (lock_node, nodes)
        if self.unified:
            self.unified_tier.split(low, upper)
            self.storage_prefetch._split(low, upper)
        return upper

    def _walk(self, key: RadixKey) -> tuple[list[int], HiTreeNode]:
        """Match ``key`` (page-aligned, non-empty) from the root, splitting where the match
        ends inside a node; returns the device slots of the matched non-evicted nodes and the
        deepest matched node."""
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
            if not as_hi(child).evicted:
                values.extend(child.value)
            node = as_hi(child)
            if split:
                break
            key = key[n:]
        return values, node

    def match_prefix(self, key: RadixKey) -> MatchResult:
        """Longest cached page-aligned prefix (device and host). ``device_indices``: the device
        slots of the matched non-evicted nodes; ``last_device_node``: the deepest matched node
        with a device copy; ``host_hit_length``: tokens of the host-only nodes below it;
        ``last_host_node``: the deepest matched backed-up node (the root counts).
        InvalidArgumentError for a ``key`` that is not a RadixKey."""
        check_instance("key", key, RadixKey)
        key = self._align(self._tree_key(key))
        if self.disable or len(key) == 0:
            return MatchResult([], self.root_node, self.root_node)
        values, last = self._walk(key)
        host_hit = 0
        device_node = last
        while device_node.evicted:
            assert device_node.host_value is not None
            host_hit += len(device_node.host_value)
            device_node = as_hi(device_node.parent)
        host_node = last
        while not host_node.backuped and not self.unified:
            host_node = as_hi(host_node.parent)
        return MatchResult(values, device_node, host_node, host_hit)

    def insert(
        self,
        key: RadixKey,
        value: list[int] | None = None,
        priority: int = 0,
        chunked: bool = False,
        inserted_len: int | None = None,
        prev_prefix_len: int = 0,
    ) -> int:
        """Insert ``key`` at ``value`` slots. A matched host-only node takes the caller's slots
        for its tokens (they become the tree's, not duplicates); other matched nodes count a
        hit (write policy permitting), which may start a write-through. Returns the tokens
        already on device. Under write-back no hit is counted. Unified rules (module
        docstring): the caller's duplicates ``value[prev_prefix_len:]`` of matched device
        nodes are freed here (one free per node; the first ``prev_prefix_len`` tokens are the
        caller's own copy of the tree's slots), and the result and the hits count the matched
        host-only tokens too. Priority: each matched node's becomes ``max(old, priority)``, the
        new leaf's is ``priority``; a split node's lower half is raised too by default, not
        under the unified rules.

        Checked before any change: ``key`` a RadixKey; given ``value``, integers, at least one
        per token, the key's slots inside the device pool, held and each once
        (:func:`~kvpool.reference.hicache.args.insert_slots`); ``priority`` an integer,
        ``chunked`` a bool, ``inserted_len`` (if given) and ``prev_prefix_len`` counts
        (:func:`~kvpool.reference.hicache.args.insert_args`)."""
        priority, chunked, inserted_len, prev_prefix_len = insert_args(
            key, RadixKey, priority, chunked, inserted_len, prev_prefix_len
        )
        explicit = value is not None
        value = list(key.token_ids) if value is None else value  # ids stand in: tests only
        key = self._tree_key(key)  # under is_eagle: its bigrams, at the first slots of value
        if explicit:
            held = None if self.disable else self.token_to_kv_pool_allocator
            value = insert_slots(value, len(key), len(self._align(key)), held)
        if self.disable:
            return 0
        key = self._align(key)
        value = list(value[: len(key)])
        if self.unified:  # 0.5.23 raises the root too (a prefetch below it inherits this)
            self.root_node.priority = max(self.root_node.priority, priority)
        if len(key) == 0:
            return 0
        now = self.clock()
        floor = hit_floor(chunked, inserted_len)
        node = self.root_node
        total_prefix = 0
        pos = 0  # tokens walked so far
        while len(key) > 0:
            child = node.children.get(self._child_key(node, key))
            if child is None:
                break
            child.last_access_time = now
            if not self.unified:
                # 0.5.16 raises the node before splitting it: the lower half keeps the raise
                child.priority = max(child.priority, priority)
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
            child.priority = max(child.priority, priority)  # unified: the matched part only
            hi = as_hi(child)
            if hi.evicted:
                hi.value = value[:n]
                hi.evicted = False
                self.evictable_size_ += n
                if self.unified:
                    total_prefix += n
                    self.unified_tier.track_duplicate(hi)
                    self._inc_hit_count(hi, total_prefix > floor)
            else:
                lo = max(0, prev_prefix_len - pos)
                if self.unified and lo < n:  # the caller's duplicates
                    self.cache_controller.evict_device(value[lo:n])
                total_prefix += n
                self._inc_hit_count(hi, total_prefix > floor)
            key, value = key[n:], value[n:]
            pos += n
            node = hi
        if len(key) > 0:
            leaf = self._new_node(key, value, node, now, priority)
            node.children[self._child_key(node, key)] = leaf
            self.evictable_size_ += len(key)
            self._inc_hit_count(leaf, total_prefix + len(key) > floor)
        return total_prefix

    def checkpoint(self, req: Req, up_to: int, chunked: bool = False) -> list[int]:
        """SGLang 0.5.23's ``checkpoint`` (see the radix cache's); under the unified rules the
        inserts free the duplicates themselves
        (:meth:`~kvpool.reference.hicache.unified_tier.UnifiedHostTier.checkpoint`). Checked
        first: the request holds a row and a lock this tree can drop, ``up_to`` lies between
        its ``cache_protected_len`` and its tokens, ``chunked`` is a bool."""
        up_to = as_count("up_to", up_to)
        chunked = as_bool("chunked", chunked)
        self._check_request(req, up_to)
        if self.unified:
            return self.unified_tier.checkpoint(req, up_to, chunked)
        return super().checkpoint(req, up_to, chunked)

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: list[int] | None = None
    ) -> None:
        """The radix cache's, checked first: the request holds a row and a lock this tree can
        drop, ``is_insert`` is a bool, ``row_read`` (if given) holds the committed slots."""
        is_insert = as_bool("is_insert", is_insert)
        self._check_request(req)
        check_row_read(row_read, int(req.kv_committed_len))
        super().cache_finished_req(req, is_insert, row_read)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: list[int] | None = None
    ) -> None:
        """The radix cache's, checked first: the request holds a row and a lock this tree can
        drop, ``chunked`` is a bool, ``row_read`` (if given) holds the prefilled slots."""
        chunked = as_bool("chunked", chunked)
        self._check_request(req)
        check_row_read(row_read, len(req.fill_ids))
        super().cache_unfinished_req(req, chunked, row_read)

    def inc_lock_ref(self, node: TreeNode | None) -> int:
        """The radix cache's; ``node`` must be a node of this tree (InvalidArgumentError, or
        LockError for a detached one) with a device copy (LockError for a host-only node: its
        tokens are not on device to protect)."""
        if node is not None:
            check_lockable(node, HiTreeNode)
        return super().inc_lock_ref(node)

    def dec_lock_ref(self, node: TreeNode | None) -> int:
        """The radix cache's; ``node`` must be a node of this tree (InvalidArgumentError, or
        LockError for a detached one)."""
        if node is not None:
            check_instance("node", node, HiTreeNode)
        return super().dec_lock_ref(node)

    def _inc_hit_count(self, node: HiTreeNode, counts: bool) -> None:
        """Count a hit (not under write-back, nor when ``counts`` is False) and write the node
        through once it has ``write_through_threshold`` hits and no backup."""
        if self.write_policy == "write_back" or not counts:
            return
        node.hit_count += 1
        if not node.backuped and node.hit_count >= self.write_through_threshold:
            if self.unified:
                self.unified_tier.backup_chain(node)
            else:
                self.write_backup(node)

    # ----------------------------------------------------------------- writes
    def write_backup(self, node: HiTreeNode, write_back: bool = False) -> int:
        """Write ``node``'s device slots to newly reserved host slots (evicting host-only leaves
        once when the host is full); returns the tokens written (0: skipped or no room).
        Write-through needs a backed-up parent and locks the node until the acknowledgement.
        InvalidArgumentError (nothing changed) unless ``node`` is a node of this tree, not the
        root, on device and not backed up yet (a second backup would leak the first's host
        slots), and ``write_back`` a bool."""
        node, write_back = backup_args(node, write_back, self.root_node, HiTreeNode)
        parent = as_hi(node.parent)
        if not write_back and parent is not self.root_node and not parent.backuped:
            return 0
        cc = self.cache_controller
        host_indices = cc.write(node.value, node.node_id)
        if host_indices is None:
            self.evict_host(len(node.value))
            host_indices = cc.write(node.value, node.node_id)
        if host_indices is None:
            return 0
        node.host_value = list(host_indices)
        node.write_through_pending_id = node.node_id
        self.ongoing_write_through[node.node_id] = (node, [node])
        if not write_back:
            self.inc_lock_ref(node)
        return len(host_indices)

    def _finish_write_through_ack(self, ack_id: int, release_lock: bool) -> None:
        lock_node, nodes = self.ongoing_write_through.pop(ack_id)
        for n in nodes:
            if n.write_through_pending_id == ack_id:
                n.write_through_pending_id = None
                if self.unified:
                    self.unified_tier.track_duplicate(n)
        if release_lock:
            self.dec_lock_ref(lock_node)

    def writing_check(self, num_acks: int | None = None, write_back: bool = False) -> int:
        """Deliver the first ``num_acks`` write acknowledgements (all when None): copy the
        content, clear the pending state and (write-through) unlock. Returns how many. Under
        the unified rules the queued writes are issued first (one acknowledgement)."""
        cc = self.cache_controller
        num_acks = optional_count("num_acks", num_acks)
        write_back = as_bool("write_back", write_back)
        if self.unified:
            cc.start_writing()
        count = len(cc.ack_write_queue) if num_acks is None else num_acks
        done = 0
        while done < count and cc.ack_write_queue:
            ack = cc.ack_write_queue[0]
            cc.complete(ack)  # an acknowledgement is delivered from the head of its queue
            cc.ack_write_queue.pop(0)
            for ack_id in ack.node_ids:
                self._finish_write_through_ack(ack_id, release_lock=not write_back)
            done += 1
        return done

    def loading_check(self, num_acks: int | None = None) -> int:
        """Deliver the first ``num_acks`` load acknowledgements (all when None): copy the
        content into the device slots and unlock the restored nodes. Returns how many."""
        cc = self.cache_controller
        num_acks = optional_count("num_acks", num_acks)
        count = len(cc.ack_load_queue) if num_acks is None else num_acks
        done = 0
        while done < count and cc.ack_load_queue:
            ack = cc.ack_load_queue[0]
            cc.complete(ack)  # an acknowledgement is delivered from the head of its queue
            cc.ack_load_queue.pop(0)
            for ack_id in ack.node_ids:
                node = self.ongoing_load_back[ack_id]
                self.dec_lock_ref(node)
                if self.unified:  # it checks the load is still pending: drop the entry after
                    self.unified_tier.finish_load_back(node)
                del self.ongoing_load_back[ack_id]
            done += 1
        return done

    def ready_to_load_host_cache(self) -> int:
        """Issue the queued loads (one transfer); returns its producer index, -1 if none."""
        return int(self.cache_controller.start_loading())

    # ----------------------------------------------------------------- load back
    def load_back(self, node: TreeNode, mem_quota: int | None = None) -> list[int] | None:
        """Restore the host-only nodes from ``node`` up to the first device node into new
        device slots; returns them (None: below the threshold, over the quota, or no room even
        after one eviction; nothing changed then). The restored path is locked until the load's
        acknowledgement. Unified rules: :meth:`UnifiedHostTier.load_back`. InvalidArgumentError
        (nothing changed) unless ``node`` is a node of this tree and ``mem_quota`` (if given)
        a count."""
        node = self._tree_node("node", node)
        mem_quota = optional_count("mem_quota", mem_quota)
        if self.unified:
            return self.unified_tier.load_back(node, mem_quota)
        last_hit_node = node
        nodes_to_load: list[HiTreeNode] = []
        while node.evicted:
            assert node.host_value is not None, f"node {node.node_id} is evicted without backup"
            nodes_to_load.insert(0, node)
            node = as_hi(node.parent)
        ancestor = node
        delta = self.inc_lock_ref(ancestor)
        host_indices = [h for n in nodes_to_load for h in (n.host_value or [])]
        if len(host_indices) < self.load_back_threshold or (
            mem_quota is not None and len(host_indices) > mem_quota + delta
        ):
            self.dec_lock_ref(ancestor)
            return None
        for n in nodes_to_load:
            n.protect_host()
        cc = self.cache_controller
        device_indices: list[int] | None = cc.load(host_indices, last_hit_node.node_id)
        if device_indices is None:
            self.evict(len(host_indices))
            device_indices = cc.load(host_indices, last_hit_node.node_id)
        self.dec_lock_ref(ancestor)
        for n in nodes_to_load:
            n.release_host()
        if device_indices is None:
            return None
        self.ongoing_load_back[last_hit_node.node_id] = last_hit_node
        offset = 0
        for n in nodes_to_load:
            size = len(n.key)
            n.value = device_indices[offset : offset + size]
            n.evicted = False
            offset += size
        self.evictable_size_ += len(device_indices)
        self.inc_lock_ref(last_hit_node)
        return device_indices

    def init_load_back(
        self, node: TreeNode, mem_quota: int | None = None
    ) -> tuple[list[int], HiTreeNode]:
        """Load back ``last_node`` if it is host-only; returns the restored device slots (empty
        if none) and the node the request should lock (the deepest one on device). Checked as
        :meth:`load_back`."""
        last_node = self._tree_node("node", node)
        mem_quota = optional_count("mem_quota", mem_quota)
        if last_node.evicted:
            loaded = self.load_back(last_node, mem_quota)
            if loaded is not None:
                return loaded, last_node
            while last_node.evicted:
                last_node = as_hi(last_node.parent)
        return [], last_node

    def _insert_helper_host(self, node: HiTreeNode, key: RadixKey, host_value: list[int]) -> int:
        """Insert ``key`` below ``node`` as host-only content at ``host_value`` (a prefetch's
        fetched tokens); returns the tokens, from the front, whose host slots are the caller's
        to free: those in the tree already, or all of them
        (:meth:`StoragePrefetch._drops_refill`). Under ``Rules.prefetch_refill == "refill"``
        with a write-through policy a matched node without a host copy takes its tokens' slots
        as one instead, and only the tokens of nodes that had a host copy are freed. The new
        leaf takes its parent's priority, the root's being SGLang's floor
        (:data:`ROOT_PRIORITY`; under the unified rules raised by every insert)."""
        now = self.clock()
        if node is not self.root_node:  # the root is never touched (its time never counts)
            node.last_access_time = now
        refill = self.rules.prefetch_refill == "refill" and self.write_policy != "write_back"
        matched = backed = 0
        refilled = False
        while len(key) > 0:
            child = node.children.get(self._child_key(node, key))
            if child is None:
                break
            child.last_access_time = now
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
            node = as_hi(child)
            if refill and node.host_value is None:  # a complete host copy: a duplicate
                node.host_value = list(host_value[:n])
                if self.unified:
                    self.unified_tier.track_duplicate(node)
                refilled = True
            else:
                # write-through keeps backed-up nodes a prefix from the root, so the freed
                # slots (the backed-up nodes') come first (SGLang asserts the same)
                assert not refilled, f"node {node.node_id}: backed up below a refilled node"
                backed += n
            key, host_value = key[n:], host_value[n:]
            matched += n
        if len(key) > 0 and self.storage_prefetch._drops_refill(node):
            return matched + len(key)
        if len(key) > 0:
            floor = node is self.root_node and not self.unified
            leaf = self._new_node(key, [], node, now, ROOT_PRIORITY if floor else node.priority)
            leaf.evicted = True
            leaf.host_value = list(host_value)
            node.children[self._child_key(node, key)] = leaf
        return backed if refill else matched

    # ----------------------------------------------------------------- eviction
    def evict(self, num_tokens: int) -> int:
        """Free device copies by policy until ``num_tokens`` tokens are freed (see the module
        docstring; :class:`~kvpool.reference.hicache.evict.HostEviction`); returns the device
        tokens freed."""
        return self.host_eviction.evict(num_tokens)

    def evict_host(self, num_tokens: int) -> int:
        """Free the host copies of unpinned host-only leaves by policy until ``num_tokens``
        host tokens are freed; such a node leaves the tree. Returns the host tokens freed.
        Under the unified write-back rules host duplicates are reclaimed first."""
        return self.host_eviction.evict_host(num_tokens)

    # ----------------------------------------------------------------- storage prefetch
    @property
    def ongoing_prefetch(self) -> dict[str, tuple[HiTreeNode, RadixKey, PrefetchOperation]]:
        """The prefetches in flight by request id (:class:`StoragePrefetch`'s)."""
        return self.storage_prefetch.ongoing_prefetch

    def prefetch_from_storage(
        self,
        req_id: str,
        last_host_node: TreeNode,
        new_input_tokens: list[int],
        extra_key: str | None = None,
    ) -> bool:
        """Start a prefetch of ``new_input_tokens`` below ``last_host_node`` for a request in
        namespace ``extra_key``; whether it started
        (:meth:`StoragePrefetch.prefetch_from_storage`)."""
        return self.storage_prefetch.prefetch_from_storage(req_id, last_host_node,
                                                           new_input_tokens, extra_key)  # fmt: skip

    def storage_hit(self, req_id: str, hit_tokens: int) -> bool:
        """Storage holds the first ``hit_tokens`` tokens: reserve host slots or revoke; whether
        the transfer started (:meth:`StoragePrefetch.storage_hit`)."""
        return self.storage_prefetch.storage_hit(req_id, hit_tokens)

    def check_prefetch_progress(self, req_id: str) -> bool:
        """End ``req_id``'s prefetch now (:meth:`StoragePrefetch.check_prefetch_progress`)."""
        return self.storage_prefetch.check_prefetch_progress(req_id)

    def release_aborted_request(self, rid: str) -> None:
        """An aborted request's prefetch (:meth:`StoragePrefetch.release_aborted_request`)."""
        self.storage_prefetch.release_aborted_request(rid)

    def prefetch_io(self, req_id: str, num_pages: int) -> int:
        """The worker of ``req_id``'s transfer runs ``num_pages`` more pages; the tokens
        fetched (:meth:`StoragePrefetch.prefetch_io`)."""
        return self.storage_prefetch.prefetch_io(req_id, num_pages)

    def drain_storage_control_queues(self) -> int:
        """Free the host slots queued for release; returns how many."""
        return self.storage_prefetch.drain_storage_control_queues()

    def prefetch_snapshots(self) -> tuple[PrefetchSnapshot, ...]:
        """The ongoing prefetches, by request id."""
        return self.storage_prefetch.prefetch_snapshots()

    # ----------------------------------------------------------------- views
    def snapshot(self) -> TreeSnapshot:
        """The tree snapshot; nodes carry their host fields (:func:`hi_tree_snapshot`)."""
        return hi_tree_snapshot(self)

    def host_snapshot(self) -> HostTierSnapshot:
        """The whole host tier (:func:`host_tier_snapshot` lists what it holds)."""
        return host_tier_snapshot(self)


__all__ = ["WRITE_POLICIES", "HiRadixCache"]

"""The optimized twin's ``HiRadixCache``: the radix cache with a host tier, on index tensors.

Same decisions, results, node ids and eviction order as
:class:`kvpool.reference.hicache.hiradix_cache.HiRadixCache` (see its docstring). Device and host
slots are int64 tensors; keys are compared as token arrays (:mod:`kvpool.optimized.key_match`). The
eviction heaps are built per call from a walk of the tree (the device/host states a node can move
between do not fit the plain twin's persistent heap), so the plain tree's heap is unused. Under
``Rules.hicache_host_tier == "unified"`` the differences are those of the reference
(:mod:`kvpool.optimized.hicache.unified_tier` and the branches here). As in the reference, the
tree owns three collaborators: ``host_eviction``
(:class:`~kvpool.optimized.hicache.evict.HostEviction`), ``storage_prefetch``
(:class:`~kvpool.optimized.hicache.prefetch.StoragePrefetch`) and ``unified_tier``
(:class:`~kvpool.optimized.hicache.unified_tier.UnifiedHostTier`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvpool.constants import ROOT_PRIORITY, floor_align
from kvpool.errors import ConfigError
from kvpool.host_checks import as_bool, as_count
from kvpool.optimized.hicache.args import check_row_read_index, insert_slot_arg
from kvpool.optimized.hicache.cache_controller import HiCacheController, PrefetchOperation
from kvpool.optimized.hicache.evict import HostEviction
from kvpool.optimized.hicache.prefetch import StoragePrefetch
from kvpool.optimized.hicache.tree_node import HiTreeNode, as_hi
from kvpool.optimized.hicache.tree_view import hi_tree_snapshot, host_tier_snapshot
from kvpool.optimized.hicache.unified_tier import UnifiedHostTier
from kvpool.optimized.key_match import child_key, matched_tokens
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.radix.radix_cache import RadixCache
from kvpool.optimized.radix.tree_view import bfs_nodes
from kvpool.optimized.radix_key import ChildKey, MatchResult, RadixKey, TreeNode, as_slots
from kvpool.optimized.req import Req
from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.protocols.pools import ReqToTokenPoolProtocol, SegmentAllocatorProtocol
from kvpool.reference.hicache.args import (
    backup_args,
    check_instance,
    check_lockable,
    check_release_request,
    insert_args,
    optional_count,
    tree_node,
)
from kvpool.reference.hicache.hiradix_cache import WRITE_POLICIES
from kvpool.reference.radix.radix_cache import hit_floor
from kvpool.rules import Rules
from kvpool.snapshot import HostTierSnapshot, PrefetchSnapshot, TreeSnapshot

_EMPTY = torch.empty(0, dtype=torch.int64)


class HiRadixCache(RadixCache):
    """Prefix cache over device slots with host backups in ``token_to_kv_pool_host``.
    ``options``: as :class:`~kvpool.optimized.radix.radix_cache.RadixCache`'s."""

    root_node: HiTreeNode

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPoolProtocol[torch.Tensor],
        token_to_kv_pool_allocator: SegmentAllocatorProtocol[torch.Tensor],
        page_size: int,
        token_to_kv_pool_host: HostPoolProtocol[torch.Tensor],
        disable: bool = False,
        eviction_policy: str = "lru",
        clock: Callable[[], float] | None = None,
        write_policy: str = "write_through",
        load_back_threshold: int = 10,
        prefetch_threshold: int = 256,
        enable_storage: bool = False,
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
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
                         eviction_policy, clock, rules=rules, options=options,
                         is_eagle=is_eagle)  # fmt: skip
        self.cache_controller.checked = self.options.checked  # the tree's mode, not the pool's

    def reset(self) -> None:
        """Forget the tree, every transfer and prefetch, and clear the host pool."""
        self.cache_controller.reset()
        self.token_to_kv_pool_host.clear()
        self.ongoing_write_through: dict[int, tuple[HiTreeNode, list[HiTreeNode]]] = {}
        self.ongoing_load_back: dict[int, HiTreeNode] = {}
        self.storage_prefetch.reset()
        self.unified_tier.reset()
        super().reset()
        self.root_node.host_value = _EMPTY
        if self.unified:  # SGLang's floor, raised by every insert
            self.root_node.priority = ROOT_PRIORITY

    @property
    def frees_duplicates(self) -> bool:
        """Whether ``insert`` frees the caller's duplicate device slots itself (unified rules)."""
        return self.unified

    def _new_node(self, key: RadixKey, value: torch.Tensor, parent: TreeNode | None, now: float,
                  priority: int = 0) -> HiTreeNode:  # fmt: skip
        node = HiTreeNode(self._next_id, key, value, parent, now, priority)
        self._next_id += 1
        return node

    def _all(self) -> list[HiTreeNode]:
        return [as_hi(n) for n in bfs_nodes(self.root_node)[1:]]

    def _device_nodes(self) -> list[HiTreeNode]:
        return [n for n in self._all() if not n.evicted]

    def total_size(self) -> int:
        """Device tokens in the tree (host-only nodes excluded)."""
        return sum(len(n) for n in self._device_nodes())

    # ----------------------------------------------------------------- argument checks
    def _tree_node(self, name: str, node: object) -> HiTreeNode:
        """``node`` as a node of this tree (InvalidArgumentError otherwise)."""
        return tree_node(name, node, self.root_node, HiTreeNode)

    def _check_request(self, req: object, up_to: int | None = None) -> None:
        """As the reference's, capped at the row's width when the pool states one."""
        width = getattr(self.req_to_token_pool, "max_context_len", None)
        check_release_request("req", req, self.root_node, HiTreeNode, up_to, width)

    def _check_row_read(self, row_read: object, need: int) -> None:
        """A caller's read of a request's row (:func:`check_row_read_index`). It overrides the
        twin radix cache's, whose release path then reads the row itself."""
        check_row_read_index(row_read, need, self.device)

    # ----------------------------------------------------------------- split / match / insert
    def _ck(self, node: TreeNode, key: RadixKey, pos: int) -> ChildKey:
        """The children key of ``key[pos:]`` below ``node``."""
        if node is self.root_node:
            return (key.extra_key, child_key(key.array, pos, self.page_size))
        return child_key(key.array, pos, self.page_size)

    def _matched(self, child: TreeNode, key: RadixKey, pos: int, stop: int) -> int:
        ps = self.page_size
        return matched_tokens(child.arr, key.array, pos, stop) // ps * ps

    def _split(self, child: TreeNode, at: int) -> HiTreeNode:
        """As the plain twin's split; the halves share the device or host state, both host
        values are cut at ``at``, a pending write covers both halves; the upper half starts
        with no host pin."""
        low = as_hi(child)
        upper = as_hi(super()._split(low, at))
        upper.evicted = low.evicted
        if low.host_value is not None:
            upper.host_value = low.host_value[:at]
            low.host_value = low.host_value[at:]
        ack = low.write_through_pending_id
        if ack is not None and ack in self.ongoing_write_through:
            nodes = self.ongoing_write_through[ack][1]
            if any(n is low for n in nodes):
                i = next(k for k, n in enumerate(nodes) if n is low)
                nodes[i : i + 1] = [upper, low]
                upper.write_through_pending_id = ack
        if self.unified:
            self.unified_tier.split(low, upper)
            self.storage_prefetch._split(low, upper)
        return upper

    def _hwalk(self, key: RadixKey, stop: int) -> tuple[list[torch.Tensor], HiTreeNode]:
        now = self.clock()
        node = self.root_node
        values: list[torch.Tensor] = []
        pos = 0
        while pos < stop:
            child = node.children.get(self._ck(node, key, pos))
            if child is None:
                break
            child.last_access_time = now
            n = self._matched(child, key, pos, stop)
            split = n < len(child)
            if split:
                child = self._split(child, n)
            hi = as_hi(child)
            if not hi.evicted:
                values.append(hi.value)
            node = hi
            pos += n
            if split:
                break
        return values, node

    def match_prefix(self, key: RadixKey) -> MatchResult:
        """Longest cached page-aligned prefix (device and host); see the reference."""
        check_instance("key", key, RadixKey)
        key = self._tree_key(key)
        aligned = floor_align(len(key), self.page_size)
        if self.disable or aligned == 0:
            return MatchResult(_EMPTY.to(self.device), self.root_node, self.root_node)
        values, last = self._hwalk(key, aligned)
        host_hit = 0
        device_node = last
        while device_node.evicted:
            assert device_node.host_value is not None
            host_hit += int(device_node.host_value.numel())
            device_node = as_hi(device_node.parent)
        host_node = last
        while not host_node.backuped and not self.unified:
            host_node = as_hi(host_node.parent)
        indices = torch.cat(values) if values else _EMPTY.to(self.device)
        return MatchResult(indices, device_node, host_node, host_hit)

    def insert(
        self,
        key: RadixKey,
        value: torch.Tensor | None = None,
        priority: int = 0,
        chunked: bool = False,
        inserted_len: int | None = None,
        prev_prefix_len: int = 0,
    ) -> int:
        """Insert ``key`` at ``value`` slots; returns the tokens already on device (unified
        rules: also the matched host-only ones, and the caller's duplicates past
        ``prev_prefix_len`` are freed here; see the reference). Checked first as the reference:
        the slots' range and ownership in checked mode (a device read), or when given as host
        values (a list)."""
        priority, chunked, inserted_len, prev_prefix_len = insert_args(
            key, RadixKey, priority, chunked, inserted_len, prev_prefix_len
        )
        tokens, key = key, self._tree_key(key)  # under EAGLE its bigrams, at value's head
        if value is None:  # the token ids stand in for slots in tests only
            value = as_slots(tokens.array, self.device)
        else:
            held = None if self.disable else self.token_to_kv_pool_allocator
            head = floor_align(len(key), self.page_size)
            value = insert_slot_arg(value, len(key), head, held, self.device, self.options.checked)
        if self.disable:
            return 0
        if self.unified:  # 0.5.23 raises the root too (see the reference)
            self.root_node.priority = max(self.root_node.priority, priority)
        aligned = floor_align(len(key), self.page_size)
        if aligned == 0:
            return 0
        now = self.clock()
        floor = hit_floor(chunked, inserted_len)
        node = self.root_node
        pos = 0
        total_prefix = 0
        while pos < aligned:
            child = node.children.get(self._ck(node, key, pos))
            if child is None:
                break
            child.last_access_time = now
            if not self.unified:
                # 0.5.16 raises the node before splitting it: the lower half keeps the raise
                child.priority = max(child.priority, priority)
            n = self._matched(child, key, pos, aligned)
            if n < len(child):
                child = self._split(child, n)
            child.priority = max(child.priority, priority)  # unified: the matched part only
            hi = as_hi(child)
            if hi.evicted:
                hi.value = value[pos : pos + n].clone()
                hi.evicted = False
                self.evictable_size_ += n
                if self.unified:
                    total_prefix += n
                    self.unified_tier.track_duplicate(hi)
                    self._inc_hit_count(hi, total_prefix > floor)
            else:
                lo = pos + max(0, prev_prefix_len - pos)
                if self.unified and lo < pos + n:  # the caller's duplicates
                    self.cache_controller.evict_device(value[lo : pos + n])
                total_prefix += n
                self._inc_hit_count(hi, total_prefix > floor)
            pos += n
            node = hi
        if pos < aligned:
            leaf_key = RadixKey.from_array(key.array[pos:aligned], key.extra_key)
            leaf = self._new_node(leaf_key, value[pos:aligned].clone(), node, now, priority)
            leaf.child_key = self._ck(node, key, pos)
            node.children[leaf.child_key] = leaf
            self._num_nodes += 1
            self.evictable_size_ += aligned - pos
            self._inc_hit_count(leaf, total_prefix + aligned - pos > floor)
        return total_prefix

    def checkpoint(self, req: Req, up_to: int, chunked: bool = False) -> torch.Tensor:
        """SGLang 0.5.23's ``checkpoint``; under the unified rules the inserts free the
        duplicates themselves (see the reference). Checked first as the reference."""
        up_to = as_count("up_to", up_to)
        chunked = as_bool("chunked", chunked)
        self._check_request(req, up_to)
        if self.unified:
            return self.unified_tier.checkpoint(req, up_to, chunked)
        return super().checkpoint(req, up_to, chunked)

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: torch.Tensor | None = None
    ) -> None:
        """The twin radix cache's, checked first as the reference."""
        is_insert = as_bool("is_insert", is_insert)
        self._check_request(req)
        self._check_row_read(row_read, int(req.kv_committed_len))
        super().cache_finished_req(req, is_insert, row_read)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: torch.Tensor | None = None
    ) -> None:
        """The twin radix cache's, checked first as the reference."""
        chunked = as_bool("chunked", chunked)
        self._check_request(req)
        self._check_row_read(row_read, len(req.fill_ids))
        super().cache_unfinished_req(req, chunked, row_read)

    def inc_lock_ref(self, node: TreeNode | None) -> int:
        """The twin radix cache's; a host-only node is refused as in the reference."""
        if node is not None:
            check_lockable(node, HiTreeNode)
        return super().inc_lock_ref(node)

    def dec_lock_ref(self, node: TreeNode | None) -> int:
        """The twin radix cache's; ``node`` must be a host-tier node (InvalidArgumentError)."""
        if node is not None:
            check_instance("node", node, HiTreeNode)
        return super().dec_lock_ref(node)

    def _inc_hit_count(self, node: HiTreeNode, counts: bool) -> None:
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
        """Write ``node``'s device slots to new host slots; see the reference (checked first
        alike: a node of this tree, not the root, on device, not backed up yet)."""
        node, write_back = backup_args(node, write_back, self.root_node, HiTreeNode)
        parent = as_hi(node.parent)
        if not write_back and parent is not self.root_node and not parent.backuped:
            return 0
        cc = self.cache_controller
        host_indices = cc.write(node.value, node.node_id)
        if host_indices is None:
            self.evict_host(len(node))
            host_indices = cc.write(node.value, node.node_id)
        if host_indices is None:
            return 0
        node.host_value = host_indices.clone()
        node.write_through_pending_id = node.node_id
        self.ongoing_write_through[node.node_id] = (node, [node])
        if not write_back:
            self.inc_lock_ref(node)
        return int(host_indices.numel())

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
        """Deliver the first ``num_acks`` write acknowledgements (all when None; unified rules:
        the queued writes are issued first)."""
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
        """Deliver the first ``num_acks`` load acknowledgements (all when None)."""
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
        """Issue the queued loads (one transfer); its producer index, -1 if none."""
        return int(self.cache_controller.start_loading())

    # ----------------------------------------------------------------- load back
    def load_back(self, node: TreeNode, mem_quota: int | None = None) -> torch.Tensor | None:
        """Restore the host-only nodes from ``node`` up to the first device node; see the
        reference (checked first alike)."""
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
        parts = [n.host_value for n in nodes_to_load if n.host_value is not None]
        host_indices = torch.cat(parts) if parts else _EMPTY
        total = int(host_indices.numel())
        if total < self.load_back_threshold or (
            mem_quota is not None and total > mem_quota + delta
        ):
            self.dec_lock_ref(ancestor)
            return None
        for n in nodes_to_load:
            n.protect_host()
        cc = self.cache_controller
        device_indices: torch.Tensor | None = cc.load(host_indices, last_hit_node.node_id)
        if device_indices is None:
            self.evict(total)
            device_indices = cc.load(host_indices, last_hit_node.node_id)
        self.dec_lock_ref(ancestor)
        for n in nodes_to_load:
            n.release_host()
        if device_indices is None:
            return None
        self.ongoing_load_back[last_hit_node.node_id] = last_hit_node
        offset = 0
        for n in nodes_to_load:
            size = len(n)
            n.value = device_indices[offset : offset + size].clone()
            n.evicted = False
            offset += size
        self.evictable_size_ += total
        self.inc_lock_ref(last_hit_node)
        return device_indices

    def init_load_back(
        self, node: TreeNode, mem_quota: int | None = None
    ) -> tuple[torch.Tensor, HiTreeNode]:
        """Load back ``last_node`` if it is host-only; see the reference (checked first alike)."""
        last_node = self._tree_node("node", node)
        mem_quota = optional_count("mem_quota", mem_quota)
        if last_node.evicted:
            loaded = self.load_back(last_node, mem_quota)
            if loaded is not None:
                return loaded, last_node
            while last_node.evicted:
                last_node = as_hi(last_node.parent)
        return _EMPTY.to(self.device), last_node

    def _insert_helper_host(self, node: HiTreeNode, key: RadixKey, host_value: torch.Tensor) -> int:
        """Insert ``key`` below ``node`` as host-only content (a prefetch's fetched tokens);
        returns the tokens whose host slots are the caller's to free (see the reference: the
        rest too when dropped; only the backed-up nodes' under ``"refill"``, whose matched nodes
        without a host copy take one, ``Rules.prefetch_refill``)."""
        now = self.clock()
        if node is not self.root_node:  # the root is never touched (its time never counts)
            node.last_access_time = now
        refill = self.rules.prefetch_refill == "refill" and self.write_policy != "write_back"
        stop = len(key)
        pos = backed = 0
        refilled = False
        while pos < stop:
            child = node.children.get(self._ck(node, key, pos))
            if child is None:
                break
            child.last_access_time = now
            n = self._matched(child, key, pos, stop)
            if n < len(child):
                child = self._split(child, n)
            node = as_hi(child)
            if refill and node.host_value is None:
                node.host_value = host_value[pos : pos + n].clone()
                if self.unified:
                    self.unified_tier.track_duplicate(node)
                refilled = True
            else:  # backed-up nodes form a prefix from the root (see the reference)
                assert not refilled, f"node {node.node_id}: backed up below a refilled node"
                backed += n
            pos += n
        if pos < stop and self.storage_prefetch._drops_refill(node):
            return stop
        if pos < stop:
            leaf_key = RadixKey.from_array(key.array[pos:stop], key.extra_key)
            empty = torch.empty(0, dtype=torch.int64, device=self.device)
            floor = node is self.root_node and not self.unified
            priority = ROOT_PRIORITY if floor else node.priority
            leaf = self._new_node(leaf_key, empty, node, now, priority)
            leaf.evicted = True
            leaf.host_value = host_value[pos:].clone()
            leaf.child_key = self._ck(node, key, pos)
            node.children[leaf.child_key] = leaf
            self._num_nodes += 1
        return backed if refill else pos

    # ----------------------------------------------------------------- eviction
    def evict(self, num_tokens: int) -> int:
        """Free device copies by policy until ``num_tokens`` tokens are freed (see the
        reference; :class:`~kvpool.optimized.hicache.evict.HostEviction`)."""
        return self.host_eviction.evict(num_tokens)

    def evict_host(self, num_tokens: int) -> int:
        """Free the host copies of unpinned host-only leaves by policy (unified write-back:
        host duplicates first); returns the host tokens freed."""
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
        """Start a prefetch below ``last_host_node``; whether it started."""
        return self.storage_prefetch.prefetch_from_storage(req_id, last_host_node,
                                                           new_input_tokens, extra_key)  # fmt: skip

    def storage_hit(self, req_id: str, hit_tokens: int) -> bool:
        """Storage holds the first ``hit_tokens`` tokens: reserve host slots or revoke."""
        return self.storage_prefetch.storage_hit(req_id, hit_tokens)

    def check_prefetch_progress(self, req_id: str) -> bool:
        """End ``req_id``'s prefetch now (best effort)."""
        return self.storage_prefetch.check_prefetch_progress(req_id)

    def release_aborted_request(self, rid: str) -> None:
        """An aborted request's prefetch: stop it, queue its fetched host slots for release."""
        self.storage_prefetch.release_aborted_request(rid)

    def prefetch_io(self, req_id: str, num_pages: int) -> int:
        """The worker of ``req_id``'s transfer runs ``num_pages`` more pages."""
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
        """The whole host tier (:func:`host_tier_snapshot`; see the reference)."""
        return host_tier_snapshot(self)


__all__ = ["HiRadixCache"]

"""SGLang 0.5.23's host tier inside ``UnifiedRadixCache`` (``Rules.hicache_host_tier ==
"unified"``): the part of ``HiRadixCache`` that runs it where it differs from 0.5.16's.

Units: tokens; device slots in ``value``, host slots in ``host_value``. A mixin of
:class:`~kvpool.reference.hicache.hiradix_cache.HiRadixCache`, which calls these methods only under
the unified rule (the default, ``"hiradix"``, never reaches them); mirrored in the twin. The rules
(specs/unified_cache.md, "The host tier inside the unified cache"):

- **Write-through backups** (:meth:`HiRadixUnified._backup_chain`): the node *and its unbacked
  ancestors* (up to the root or the first backed-up one) are backed up ancestors first, each
  with its own host slots, lock and acknowledgement id, stopping at the first that finds no
  host room. Host room: when the host pool has fewer free slots than the node has tokens, the
  shortfall is evicted from host first (:meth:`evict_host`); if that frees less, no room. The
  copies are *queued* (``write(..., flush=False)``) and issued together by the next
  ``writing_check`` as one acknowledgement.
- **Host duplicates** (``full_host_duplicates``, insertion-ordered): a node on device whose host
  copy is complete (no write or load in flight) is registered when it becomes one: an
  acknowledged write, an insert that gives a host-only node device slots, a split's upper half,
  a load-back's acknowledgement (the anchor's path). It leaves when deleted or reclaimed; a
  demoted entry stays where it was (SGLang deregisters lazily), so a node that becomes a
  duplicate again keeps its old place. Under write-back, ``evict_host`` first reclaims host
  copies of duplicates in that order (a first pass spares unlocked device leaves, whose
  demotion is near; a second takes them): each loses its host copy and stays on device.
- **Write-back eviction** (:meth:`HiRadixUnified._evict_write_back_unified`): leaf by leaf, a
  backed-up leaf is demoted; an unbacked one is backed up, the write waited for
  (``writing_check(write_back=True)``), then demoted; with no host room its subtree is dropped
  (:meth:`HiRadixUnified._drop_subtree_unified`) unless a node there is locked, pinned or in
  flight.
- **Checkpoint** (:meth:`HiRadixUnified._checkpoint_unified`, the request lifecycle's insert of
  a finished request or a prefill chunk): as the radix cache's ``checkpoint``, except that the
  insert frees the duplicates itself past the request's ``cache_protected_len``
  (``prev_prefix_len``) and the prompt re-insert frees none (``prev_prefix_len`` = the prompt):
  no separate free follows.
- **Load-back** (:meth:`HiRadixUnified._load_back_unified`): the anchor's host copy is pinned
  until the load's acknowledgement; fewer than ``max(1, load_back_threshold)`` tokens do not
  move; a device shortfall is evicted before allocating (only the shortfall); under
  write-back the loaded nodes are marked ``load_back_pending_id`` until the acknowledgement.
"""

from __future__ import annotations

import heapq
from typing import Any

from kvpool.constants import floor_align
from kvpool.reference.hicache.tree_node import HiTreeNode
from kvpool.reference.radix_key import RadixKey, TreeNode
from kvpool.reference.req import Req


def _hi(node: TreeNode | None) -> HiTreeNode:
    assert isinstance(node, HiTreeNode)
    return node


class HiRadixUnified:
    """The unified host tier's methods of ``HiRadixCache`` (see the module docstring)."""

    root_node: Any
    write_policy: str
    cache_controller: Any
    token_to_kv_pool_allocator: Any
    token_to_kv_pool_host: Any
    evictable_size_: int
    load_back_threshold: int
    ongoing_write_through: dict[int, tuple[HiTreeNode, list[HiTreeNode]]]
    ongoing_load_back: dict[int, HiTreeNode]
    inc_lock_ref: Any
    dec_lock_ref: Any
    evict: Any
    evict_host: Any
    writing_check: Any
    priority_fn: Any
    _device_evictable: Any
    _evict_backuped: Any
    _delete: Any
    _make_heap: Any
    _promote_from: Any
    _device_leaves: Any
    page_size: int
    rules: Any
    req_to_token_pool: Any
    insert: Any
    match_prefix: Any

    def reset_unified(self) -> None:
        """Forget the duplicate registry and the load-backs' host pins (frees nothing)."""
        self.full_host_duplicates: dict[int, HiTreeNode] = {}
        self.load_host_pins: dict[int, list[HiTreeNode]] = {}

    # ----------------------------------------------------------------- duplicates
    def _track_duplicate(self, node: HiTreeNode) -> None:
        """Register ``node`` if it is a settled duplicate (device and complete host copy, no
        load in flight), else drop it; a registered node keeps its place."""
        settled = (
            node is not self.root_node
            and not node.evicted
            and node.host_value is not None
            and node.write_through_pending_id is None
            and node.load_back_pending_id is None
        )
        if settled:
            self.full_host_duplicates.setdefault(node.node_id, node)
        else:
            self.full_host_duplicates.pop(node.node_id, None)

    def _is_device_leaf(self, node: HiTreeNode) -> bool:
        return (
            node is not self.root_node
            and not node.evicted
            and self._device_evictable(node)
            and all(_hi(c).evicted for c in node.children.values())
        )

    def _reclaim_host_duplicates(self, num_tokens: int) -> int:
        """Write-back: free the host copies of registered duplicates in registry order until
        ``num_tokens`` host tokens are freed (see the module docstring); returns them."""
        freed = 0
        swept: list[int] = []
        for spare_leaves in (True, False):
            if freed >= num_tokens:
                break
            for node in list(self.full_host_duplicates.values()):
                if freed >= num_tokens:
                    break
                if node.evicted or node.host_value is None:
                    swept.append(node.node_id)  # stale entry
                    continue
                if spare_leaves and self._is_device_leaf(node):
                    continue
                if (
                    node.write_through_pending_id is not None
                    or node.load_back_pending_id is not None
                    or node.host_ref_counter > 0
                ):
                    continue
                freed += self.cache_controller.evict_host(node.host_value)
                node.host_value = None
                swept.append(node.node_id)
        for node_id in swept:
            self.full_host_duplicates.pop(node_id, None)
        return freed

    # ----------------------------------------------------------------- backups
    def _reserve_host_write(self, node: HiTreeNode) -> list[int] | None:
        """Reserve host slots for ``node``'s device slots (evicting the host shortfall first)
        and queue the copy; None when there is no room."""
        size = len(node.value)
        available = int(self.token_to_kv_pool_host.available_size())
        if available < size:
            needed = size - available
            if self.evict_host(needed) < needed:
                return None
        got = self.cache_controller.write(node.value, node.node_id, flush=False)
        return None if got is None else list(got)

    def _backup_chain(self, node: HiTreeNode, write_back: bool = False) -> int:
        """Back up ``node`` (write-through: after its unbacked ancestors, top-down) with queued
        copies; stops at the first without host room. Returns the host tokens of the last
        backup made (0: none, or the chain stopped)."""
        chain = [node]
        if not write_back:
            up = _hi(node.parent)
            while up is not self.root_node and up.host_value is None:
                chain.append(up)
                up = _hi(up.parent)
            chain.reverse()
        written = 0
        for n in chain:
            if n.host_value is not None:
                continue  # backed up by an earlier chain of the same insert
            host = self._reserve_host_write(n)
            if host is None:
                return 0
            n.host_value = host
            n.write_through_pending_id = n.node_id
            self.ongoing_write_through[n.node_id] = (n, [n])
            if not write_back:
                self.inc_lock_ref(n)
            written = len(host)
        return written

    # ----------------------------------------------------------------- eviction
    def _evict_write_back_unified(self, num_tokens: int) -> int:
        """Write-back eviction leaf by leaf (see the module docstring); returns the device
        tokens freed."""
        heap = self._make_heap(self._device_leaves())
        evicted = 0
        while evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if not self._device_evictable(x) or x.evicted or x.parent is None:
                continue
            parent = _hi(x.parent)
            if x.host_value is not None:
                evicted += self._evict_backuped(x)
            elif self._backup_chain(x, write_back=True) > 0:
                self.writing_check(write_back=True)
                evicted += self._evict_backuped(x)
            else:
                evicted += self._drop_subtree_unified(x)
            self._promote_from(parent, heap)
        self.writing_check(write_back=True)
        return evicted

    def _drop_subtree_unified(self, top: HiTreeNode) -> int:
        """Write-back with no host room: drop the unbacked device leaf ``top`` and its host-only
        subtree unless a node there is locked, pinned or has a transfer in flight (then
        nothing; returns 0). The device slots are freed first, then the host copies in reverse
        depth-first order (children popped from the end). Returns the device tokens freed."""
        descendants: list[HiTreeNode] = []
        stack = [_hi(c) for c in top.children.values()]
        while stack:
            cur = stack.pop()
            descendants.append(cur)
            stack.extend(_hi(c) for c in cur.children.values())
        for n in [top, *descendants]:
            if (
                n.lock_ref > 0
                or n.host_ref_counter > 0
                or n.write_through_pending_id is not None
                or n.load_back_pending_id is not None
            ):
                return 0
        freed = int(self.cache_controller.evict_device(top.value))
        self.evictable_size_ -= freed
        for n in reversed(descendants):
            assert n.evicted and n.host_value is not None, f"node {n.node_id} not host-only"
            self.cache_controller.evict_host(n.host_value)
            n.host_value = None
            self.full_host_duplicates.pop(n.node_id, None)
            self._delete(n)
        top.value = []
        top.evicted = True
        self.full_host_duplicates.pop(top.node_id, None)
        self._delete(top)
        return freed

    # ----------------------------------------------------------------- checkpoint
    def _checkpoint_unified(self, req: Req, up_to: int, chunked: bool = False) -> list[int]:
        """SGLang 0.5.23's ``checkpoint_into_tree`` with the host tier: insert the page-aligned
        part of the first ``up_to`` tokens (the row's slots; hits by ``rules.hit_count``),
        freeing the duplicates past ``cache_protected_len``; when the page-aligned prompt is
        shorter but not empty, insert it again with ``priority + 1``, no hit and no free; match
        again, rewrite ``row[cache_protected_len:matched]`` with the tree's slots, move
        ``cache_protected_len`` and the lock to the matched node. Returns ``row[:up_to]`` as it
        is afterwards. Writes the inserts start are queued (the lifecycle issues them)."""
        assert req.req_pool_idx is not None
        row = req.req_pool_idx
        kv: list[int] = list(self.req_to_token_pool.read(row, 0, up_to))
        aligned = floor_align(up_to, self.page_size)
        key = RadixKey(req.all_token_ids[:aligned], req.extra_key)
        protected = req.cache_protected_len
        if self.rules.hit_count == "chunked":
            self.insert(key, kv[:aligned], priority=req.priority, chunked=chunked,
                        prev_prefix_len=protected)  # fmt: skip
        else:
            self.insert(key, kv[:aligned], priority=req.priority,
                        inserted_len=req.cache_inserted_len, prev_prefix_len=protected)  # fmt: skip
            req.cache_inserted_len = max(req.cache_inserted_len, len(key))
        prompt = floor_align(min(up_to, len(req.origin_input_ids)), self.page_size)
        if 0 < prompt < aligned:
            self.insert(key[:prompt], kv[:prompt], priority=req.priority + 1,
                        inserted_len=prompt, prev_prefix_len=prompt)  # fmt: skip
        match = self.match_prefix(key)
        new_indices: list[int] = list(match.device_indices)
        self.req_to_token_pool.write(
            (row, slice(protected, len(new_indices))), new_indices[protected:]
        )
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = len(new_indices)
        req.last_node = match.last_device_node
        return new_indices + kv[len(new_indices) :]

    # ----------------------------------------------------------------- load back
    def _load_back_unified(
        self, last_hit_node: HiTreeNode, mem_quota: int | None
    ) -> list[int] | None:
        """Restore the host-only nodes from ``last_hit_node`` up to the first device node (see
        the module docstring); None when nothing moved."""
        nodes_to_load: list[HiTreeNode] = []
        node = last_hit_node
        while node.evicted:
            assert node.host_value is not None, f"node {node.node_id} is evicted without backup"
            nodes_to_load.insert(0, node)
            node = _hi(node.parent)
        ancestor = node
        last_hit_node.protect_host()  # the anchor's host lock, held until the acknowledgement
        for n in nodes_to_load:
            n.protect_host()  # SGLang locks the evicted segment for the call
        delta = self.inc_lock_ref(ancestor)
        host_indices = [h for n in nodes_to_load for h in (n.host_value or [])]
        size = len(host_indices)
        allocator = self.token_to_kv_pool_allocator
        refused = size < max(1, self.load_back_threshold) or (
            mem_quota is not None and size - delta > mem_quota
        )
        if not refused and allocator.available_size() < size:
            self.evict(size - allocator.available_size())
            refused = allocator.available_size() < size
        device: list[int] | None = None
        if not refused:
            got = self.cache_controller.load(host_indices, last_hit_node.node_id)
            device = None if got is None else list(got)
        self.dec_lock_ref(ancestor)
        for n in nodes_to_load:
            n.release_host()
        if device is None:
            last_hit_node.release_host()
            return None
        offset = 0
        for n in nodes_to_load:
            n.value = device[offset : offset + len(n.key)]
            n.evicted = False
            offset += len(n.key)
            if self.write_policy == "write_back":
                n.load_back_pending_id = last_hit_node.node_id
        self.evictable_size_ += size
        self.ongoing_load_back[last_hit_node.node_id] = last_hit_node
        self.load_host_pins[last_hit_node.node_id] = [last_hit_node]
        self.inc_lock_ref(last_hit_node)
        return device

    def _finish_load_back(self, anchor: HiTreeNode) -> None:
        """A load's acknowledgement: drop the anchor's host lock, then walk the anchor's path
        (write-back: the nodes this load marked) clearing the marks and registering the
        duplicates."""
        for n in self.load_host_pins.pop(anchor.node_id, []):
            n.release_host()
        node: HiTreeNode | None = anchor
        while node is not None and node is not self.root_node:
            if self.write_policy == "write_back":
                if node.load_back_pending_id != anchor.node_id:
                    node = _hi(node.parent) if node.parent is not None else None
                    continue
                node.load_back_pending_id = None
            self._track_duplicate(node)
            node = _hi(node.parent) if node.parent is not None else None

    def _split_unified(self, low: HiTreeNode, upper: HiTreeNode) -> None:
        """A split's upper half keeps the creation time of the node it was cut from (as the
        unified tree's splits), inherits its load mark and load-back host locks, and is
        registered if it is a duplicate."""
        upper.creation_time = low.creation_time
        upper.load_back_pending_id = low.load_back_pending_id
        for pins in self.load_host_pins.values():
            if low in pins:
                pins.append(upper)
                upper.protect_host()
        self._track_duplicate(upper)


__all__ = ["HiRadixUnified"]

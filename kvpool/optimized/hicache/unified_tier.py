"""The optimized twin's unified host tier (``Rules.hicache_host_tier == "unified"``).

Same rules, order and results as :mod:`kvpool.reference.hicache.unified_tier` (see its docstring);
device and host slots are int64 tensors. A mixin of
:class:`~kvpool.optimized.hicache.hiradix_cache.HiRadixCache`, reached only under the unified rule.
"""

from __future__ import annotations

import heapq
from typing import Any

import torch

from kvpool.constants import floor_align
from kvpool.optimized.hicache.tree_node import HiTreeNode
from kvpool.optimized.radix_key import TreeNode, req_key
from kvpool.optimized.req import Req

_EMPTY = torch.empty(0, dtype=torch.int64)


def _hi(node: TreeNode | None) -> HiTreeNode:
    assert isinstance(node, HiTreeNode)
    return node


class HiRadixUnified:
    """The unified host tier's methods of the twin's ``HiRadixCache``."""

    root_node: Any
    device: Any
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
    _read_row: Any

    def reset_unified(self) -> None:
        """Forget the duplicate registry and the load-backs' host pins (frees nothing)."""
        self.full_host_duplicates: dict[int, HiTreeNode] = {}
        self.load_host_pins: dict[int, list[HiTreeNode]] = {}

    # ----------------------------------------------------------------- duplicates
    def _track_duplicate(self, node: HiTreeNode) -> None:
        """Register ``node`` if it is a settled duplicate, else drop it (see the reference)."""
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
        """Write-back: free registered duplicates' host copies in registry order until
        ``num_tokens`` host tokens are freed; returns them (see the reference)."""
        freed = 0
        swept: list[int] = []
        for spare_leaves in (True, False):
            if freed >= num_tokens:
                break
            for node in list(self.full_host_duplicates.values()):
                if freed >= num_tokens:
                    break
                if node.evicted or node.host_value is None:
                    swept.append(node.node_id)
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
    def _reserve_host_write(self, node: HiTreeNode) -> torch.Tensor | None:
        """Reserve host slots for ``node`` (the host shortfall evicted first) and queue the
        copy; None when there is no room."""
        size = int(node.value.numel())
        available = int(self.token_to_kv_pool_host.available_size())
        if available < size:
            needed = size - available
            if self.evict_host(needed) < needed:
                return None
        got: torch.Tensor | None = self.cache_controller.write(
            node.value, node.node_id, flush=False
        )
        return got

    def _backup_chain(self, node: HiTreeNode, write_back: bool = False) -> int:
        """Back up ``node`` (write-through: after its unbacked ancestors, top-down) with queued
        copies; see the reference."""
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
                continue
            host = self._reserve_host_write(n)
            if host is None:
                return 0
            n.host_value = host.clone()
            n.write_through_pending_id = n.node_id
            self.ongoing_write_through[n.node_id] = (n, [n])
            if not write_back:
                self.inc_lock_ref(n)
            written = int(host.numel())
        return written

    # ----------------------------------------------------------------- eviction
    def _evict_write_back_unified(self, num_tokens: int) -> int:
        """Write-back eviction leaf by leaf; returns the device tokens freed."""
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
        """Drop ``top`` and its host-only subtree unless a node there is locked, pinned or in
        flight; device slots first, then host copies in reverse depth-first order (see the
        reference). Returns the device tokens freed."""
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
        freed = self.cache_controller.evict_device(top.value)
        self.evictable_size_ -= freed
        for n in reversed(descendants):
            assert n.evicted and n.host_value is not None, f"node {n.node_id} not host-only"
            self.cache_controller.evict_host(n.host_value)
            n.host_value = None
            self.full_host_duplicates.pop(n.node_id, None)
            self._delete(n)
        top.value = _EMPTY.to(self.device)
        top.evicted = True
        self.full_host_duplicates.pop(top.node_id, None)
        self._delete(top)
        return int(freed)

    # ----------------------------------------------------------------- checkpoint
    def _checkpoint_unified(self, req: Req, up_to: int, chunked: bool = False) -> torch.Tensor:
        """SGLang 0.5.23's ``checkpoint_into_tree`` with the host tier (see the reference):
        the inserts free the duplicates past ``cache_protected_len`` (the prompt re-insert
        none), then the match, the row rewrite and the lock move. Returns ``row[:up_to]`` as
        it is afterwards (int64)."""
        assert req.req_pool_idx is not None
        row = req.req_pool_idx
        kv = self._read_row(row, up_to)
        aligned = floor_align(up_to, self.page_size)
        key = req_key(req, aligned)
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
            self.insert(req_key(req, prompt), kv[:prompt], priority=req.priority + 1,
                        inserted_len=prompt, prev_prefix_len=prompt)  # fmt: skip
        match = self.match_prefix(key)
        new_indices = match.device_indices
        num_new = len(new_indices)
        self.req_to_token_pool.write((row, slice(protected, num_new)), new_indices[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = num_new
        req.last_node = match.last_device_node
        return torch.cat((new_indices, kv[num_new:]))

    # ----------------------------------------------------------------- load back
    def _load_back_unified(
        self, last_hit_node: HiTreeNode, mem_quota: int | None
    ) -> torch.Tensor | None:
        """Restore the host-only nodes from ``last_hit_node`` up to the first device node; see
        the reference."""
        nodes_to_load: list[HiTreeNode] = []
        node = last_hit_node
        while node.evicted:
            assert node.host_value is not None, f"node {node.node_id} is evicted without backup"
            nodes_to_load.insert(0, node)
            node = _hi(node.parent)
        ancestor = node
        last_hit_node.protect_host()
        for n in nodes_to_load:
            n.protect_host()
        delta = self.inc_lock_ref(ancestor)
        parts = [n.host_value for n in nodes_to_load if n.host_value is not None]
        host_indices = torch.cat(parts) if parts else _EMPTY
        size = int(host_indices.numel())
        allocator = self.token_to_kv_pool_allocator
        refused = size < max(1, self.load_back_threshold) or (
            mem_quota is not None and size - delta > mem_quota
        )
        if not refused and allocator.available_size() < size:
            self.evict(size - allocator.available_size())
            refused = allocator.available_size() < size
        device: torch.Tensor | None = None
        if not refused:
            device = self.cache_controller.load(host_indices, last_hit_node.node_id)
        self.dec_lock_ref(ancestor)
        for n in nodes_to_load:
            n.release_host()
        if device is None:
            last_hit_node.release_host()
            return None
        offset = 0
        for n in nodes_to_load:
            length = len(n)
            n.value = device[offset : offset + length].clone()
            n.evicted = False
            offset += length
            if self.write_policy == "write_back":
                n.load_back_pending_id = last_hit_node.node_id
        self.evictable_size_ += size
        self.ongoing_load_back[last_hit_node.node_id] = last_hit_node
        self.load_host_pins[last_hit_node.node_id] = [last_hit_node]
        self.inc_lock_ref(last_hit_node)
        return device

    def _finish_load_back(self, anchor: HiTreeNode) -> None:
        """A load's acknowledgement: unpin, clear the marks, register duplicates (see the
        reference)."""
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
        """A split's upper half: creation time, load mark, load host locks, registry (see the
        reference)."""
        upper.creation_time = low.creation_time
        upper.load_back_pending_id = low.load_back_pending_id
        for pins in self.load_host_pins.values():
            if any(n is low for n in pins):
                pins.append(upper)
                upper.protect_host()
        self._track_duplicate(upper)


__all__ = ["HiRadixUnified"]

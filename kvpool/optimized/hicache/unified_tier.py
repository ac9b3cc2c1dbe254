"""The optimized twin's unified host tier (``Rules.hicache_host_tier == "unified"``).

Same rules, order and results as :mod:`kvpool.reference.hicache.unified_tier` (see its docstring);
device and host slots are int64 tensors. :class:`UnifiedHostTier` is a collaborator the tree owns
(``HiRadixCache.unified_tier``), reached only under the unified rule; it reaches the tree through
:class:`UnifiedTree`. Its write-back eviction and reclaim of host duplicates are the tree's
eviction's (:class:`~kvpool.optimized.hicache.evict.HostEviction`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from kvpool.errors import InvalidArgumentError
from kvpool.host_checks import as_bool, as_count
from kvpool.optimized.hicache.cache_controller import HiCacheController
from kvpool.optimized.hicache.tree_node import HiTreeNode, as_hi
from kvpool.optimized.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.optimized.req import Req
from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.protocols.pools import ReqToTokenPoolProtocol, SegmentAllocatorProtocol
from kvpool.reference.hicache.args import check_lock_holder, check_node, check_span
from kvpool.rules import Rules

_EMPTY = torch.empty(0, dtype=torch.int64)


class UnifiedTree(Protocol):
    """The parts of the twin's ``HiRadixCache`` the unified host tier uses."""

    evictable_size_: int
    ongoing_write_through: dict[int, tuple[HiTreeNode, list[HiTreeNode]]]
    ongoing_load_back: dict[int, HiTreeNode]

    @property
    def root_node(self) -> HiTreeNode: ...

    @property
    def page_size(self) -> int: ...

    @property
    def rules(self) -> Rules: ...

    @property
    def write_policy(self) -> str: ...

    @property
    def load_back_threshold(self) -> int: ...

    @property
    def req_to_token_pool(self) -> ReqToTokenPoolProtocol[torch.Tensor]: ...

    @property
    def token_to_kv_pool_allocator(self) -> SegmentAllocatorProtocol[torch.Tensor]: ...

    @property
    def cache_controller(self) -> HiCacheController: ...

    @property
    def token_to_kv_pool_host(self) -> HostPoolProtocol[torch.Tensor]: ...

    def _read_row(self, row: int, stop: int) -> torch.Tensor: ...

    def insert(
        self,
        key: RadixKey,
        value: torch.Tensor | None = None,
        priority: int = 0,
        chunked: bool = False,
        inserted_len: int | None = None,
        prev_prefix_len: int = 0,
    ) -> int: ...

    def match_prefix(self, key: RadixKey) -> MatchResult: ...

    def inc_lock_ref(self, node: TreeNode | None) -> int: ...

    def dec_lock_ref(self, node: TreeNode | None) -> int: ...

    def evict(self, num_tokens: int) -> int: ...

    def evict_host(self, num_tokens: int) -> int: ...

    def _tree_node(self, name: str, node: object) -> HiTreeNode: ...

    def _req_key(self, req: Req, num_tokens: int) -> RadixKey: ...

    def _cached_len(self, num_tokens: int) -> int: ...


class UnifiedHostTier:
    """The unified host tier of one twin ``HiRadixCache`` (see the reference)."""

    def __init__(self, tree: UnifiedTree) -> None:
        self.tree = tree
        self.reset()

    def reset(self) -> None:
        """Forget the duplicate registry and the load-backs' host pins (frees nothing)."""
        self.full_host_duplicates: dict[int, HiTreeNode] = {}
        self.load_host_pins: dict[int, list[HiTreeNode]] = {}

    # ----------------------------------------------------------------- duplicates
    def track_duplicate(self, node: HiTreeNode) -> None:
        """Register ``node`` if it is a settled duplicate, else drop it (see the reference;
        checked alike)."""
        check_node("node", node, self.tree.root_node, HiTreeNode)
        settled = (
            node is not self.tree.root_node
            and not node.evicted
            and node.host_value is not None
            and node.write_through_pending_id is None
            and node.load_back_pending_id is None
        )
        if settled:
            self.full_host_duplicates.setdefault(node.node_id, node)
        else:
            self.full_host_duplicates.pop(node.node_id, None)

    # ----------------------------------------------------------------- backups
    def _reserve_host_write(self, node: HiTreeNode) -> torch.Tensor | None:
        """Reserve host slots for ``node`` (the host shortfall evicted first) and queue the
        copy; None when there is no room."""
        tree = self.tree
        size = int(node.value.numel())
        available = int(tree.token_to_kv_pool_host.available_size())
        if available < size:
            needed = size - available
            if tree.evict_host(needed) < needed:
                return None
        got: torch.Tensor | None = tree.cache_controller.write(
            node.value, node.node_id, flush=False
        )
        return got

    def backup_chain(self, node: HiTreeNode, write_back: bool = False) -> int:
        """Back up ``node`` (write-through: after its unbacked ancestors, top-down) with queued
        copies; see the reference (checked first alike)."""
        tree = self.tree
        node = tree._tree_node("node", node)
        write_back = as_bool("write_back", write_back)
        if node is tree.root_node or node.evicted or node.host_value is not None:
            raise InvalidArgumentError(
                f"node {node.node_id} is the root, host-only or backed up already"
            )
        chain = [node]
        if not write_back:
            up = as_hi(node.parent)
            while up is not tree.root_node and up.host_value is None:
                chain.append(up)
                up = as_hi(up.parent)
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
            tree.ongoing_write_through[n.node_id] = (n, [n])
            if not write_back:
                tree.inc_lock_ref(n)
            written = int(host.numel())
        return written

    # ----------------------------------------------------------------- checkpoint
    def checkpoint(self, req: Req, up_to: int, chunked: bool = False) -> torch.Tensor:
        """SGLang 0.5.23's ``checkpoint_into_tree`` with the host tier (see the reference):
        the inserts free the duplicates past ``cache_protected_len`` (the prompt re-insert
        none), then the match, the row rewrite and the lock move. Returns ``row[:up_to]`` as
        it is afterwards (int64)."""
        tree = self.tree
        up_to = as_count("up_to", up_to)
        chunked = as_bool("chunked", chunked)
        check_lock_holder("req", req, tree.root_node, HiTreeNode)
        width = int(getattr(tree.req_to_token_pool, "max_context_len", up_to))
        check_span("up_to", up_to, req.cache_protected_len, min(len(req.all_token_ids), width))
        assert req.req_pool_idx is not None
        row = req.req_pool_idx
        kv = tree._read_row(row, up_to)
        key, aligned = tree._req_key(req, up_to), tree._cached_len(up_to)  # bigrams: one fewer
        protected = req.cache_protected_len
        if tree.rules.hit_count == "chunked":
            tree.insert(key, kv[:aligned], priority=req.priority, chunked=chunked,
                        prev_prefix_len=protected)  # fmt: skip
        else:
            tree.insert(key, kv[:aligned], priority=req.priority,
                        inserted_len=req.cache_inserted_len, prev_prefix_len=protected)  # fmt: skip
            req.cache_inserted_len = max(req.cache_inserted_len, aligned)
        prompt_tokens = min(up_to, len(req.origin_input_ids))
        prompt = tree._cached_len(prompt_tokens)
        if 0 < prompt < aligned:
            tree.insert(tree._req_key(req, prompt_tokens), kv[:prompt],
                        priority=req.priority + 1, inserted_len=prompt,
                        prev_prefix_len=prompt)  # fmt: skip
        match = tree.match_prefix(key)
        new_indices = match.device_indices
        num_new = len(new_indices)
        tree.req_to_token_pool.write((row, slice(protected, num_new)), new_indices[protected:])
        tree.dec_lock_ref(req.last_node)
        tree.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = num_new
        req.last_node = match.last_device_node
        return torch.cat((new_indices, kv[num_new:]))

    # ----------------------------------------------------------------- load back
    def load_back(self, last_hit_node: HiTreeNode, mem_quota: int | None) -> torch.Tensor | None:
        """Restore the host-only nodes from ``last_hit_node`` up to the first device node; see
        the reference (checked first alike)."""
        tree = self.tree
        last_hit_node = tree._tree_node("last_hit_node", last_hit_node)
        if mem_quota is not None:
            mem_quota = as_count("mem_quota", mem_quota)
        nodes_to_load: list[HiTreeNode] = []
        node = last_hit_node
        while node.evicted:
            assert node.host_value is not None, f"node {node.node_id} is evicted without backup"
            nodes_to_load.insert(0, node)
            node = as_hi(node.parent)
        ancestor = node
        last_hit_node.protect_host()
        for n in nodes_to_load:
            n.protect_host()
        delta = tree.inc_lock_ref(ancestor)
        parts = [n.host_value for n in nodes_to_load if n.host_value is not None]
        host_indices = torch.cat(parts) if parts else _EMPTY
        size = int(host_indices.numel())
        allocator = tree.token_to_kv_pool_allocator
        refused = size < max(1, tree.load_back_threshold) or (
            mem_quota is not None and size - delta > mem_quota
        )
        if not refused and allocator.available_size() < size:
            tree.evict(size - allocator.available_size())
            refused = allocator.available_size() < size
        device: torch.Tensor | None = None
        if not refused:
            device = tree.cache_controller.load(host_indices, last_hit_node.node_id)
        tree.dec_lock_ref(ancestor)
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
            if tree.write_policy == "write_back":
                n.load_back_pending_id = last_hit_node.node_id
        tree.evictable_size_ += size
        tree.ongoing_load_back[last_hit_node.node_id] = last_hit_node
        self.load_host_pins[last_hit_node.node_id] = [last_hit_node]
        tree.inc_lock_ref(last_hit_node)
        return device

    def finish_load_back(self, anchor: HiTreeNode) -> None:
        """A load's acknowledgement: unpin, clear the marks, register duplicates (see the
        reference; checked first alike)."""
        anchor = self.tree._tree_node("anchor", anchor)
        if self.tree.ongoing_load_back.get(anchor.node_id) is not anchor:
            raise InvalidArgumentError(f"anchor {anchor.node_id} has no load in flight")
        for n in self.load_host_pins.pop(anchor.node_id, []):
            n.release_host()
        write_back = self.tree.write_policy == "write_back"
        node: HiTreeNode | None = anchor
        while node is not None and node is not self.tree.root_node:
            if write_back:
                if node.load_back_pending_id != anchor.node_id:
                    node = as_hi(node.parent) if node.parent is not None else None
                    continue
                node.load_back_pending_id = None
            self.track_duplicate(node)
            node = as_hi(node.parent) if node.parent is not None else None

    def split(self, low: HiTreeNode, upper: HiTreeNode) -> None:
        """A split's upper half: creation time, load mark, load host locks, registry (see the
        reference; checked first alike)."""
        low = self.tree._tree_node("low", low)
        upper = self.tree._tree_node("upper", upper)
        if low.parent is not upper or upper is self.tree.root_node:
            raise InvalidArgumentError(
                f"upper {upper.node_id} is not the upper half of {low.node_id}"
            )
        upper.creation_time = low.creation_time
        upper.load_back_pending_id = low.load_back_pending_id
        for pins in self.load_host_pins.values():
            if any(n is low for n in pins):
                pins.append(upper)
                upper.protect_host()
        self.track_duplicate(upper)


__all__ = ["UnifiedHostTier", "UnifiedTree"]

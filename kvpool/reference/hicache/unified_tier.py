"""SGLang 0.5.23's host tier inside ``UnifiedRadixCache`` (``Rules.hicache_host_tier ==
"unified"``): the part of ``HiRadixCache`` that runs it where it differs from 0.5.16's.

Units: tokens; device slots in ``value``, host slots in ``host_value``.
:class:`UnifiedHostTier` is a collaborator the tree owns (``HiRadixCache.unified_tier``), called
only under the unified rule (the default, ``"hiradix"``, never reaches it); it reaches the tree
through :class:`UnifiedTree`, exactly the parts it uses. Its write-back eviction and the reclaim
of host duplicates are the tree's eviction's
(:class:`~kvpool.reference.hicache.evict.HostEviction`). Mirrored in the twin. The rules
(specs/unified_cache.md, "The host tier inside the unified cache"):

- **Write-through backups** (:meth:`UnifiedHostTier.backup_chain`): the node *and its unbacked
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
- **Write-back eviction** (``HostEviction.evict_write_back_unified``): leaf by leaf, a
  backed-up leaf is demoted; an unbacked one is backed up, the write waited for
  (``writing_check(write_back=True)``), then demoted; with no host room its subtree is dropped
  unless a node there is locked, pinned or in flight.
- **Checkpoint** (:meth:`UnifiedHostTier.checkpoint`, the request lifecycle's insert of
  a finished request or a prefill chunk): as the radix cache's ``checkpoint``, except that the
  insert frees the duplicates itself past the request's ``cache_protected_len``
  (``prev_prefix_len``) and the prompt re-insert frees none (``prev_prefix_len`` = the prompt):
  no separate free follows.
- **Load-back** (:meth:`UnifiedHostTier.load_back`): the anchor's host copy is pinned
  until the load's acknowledgement; fewer than ``max(1, load_back_threshold)`` tokens do not
  move; a device shortfall is evicted before allocating (only the shortfall); under
  write-back the loaded nodes are marked ``load_back_pending_id`` until the acknowledgement.
"""

from __future__ import annotations

from typing import Protocol

from kvpool.errors import InvalidArgumentError
from kvpool.host_checks import as_bool, as_count
from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.reference.hicache.args import check_lock_holder, check_node, check_span
from kvpool.reference.hicache.cache_controller import HiCacheController
from kvpool.reference.hicache.tree_node import HiTreeNode, as_hi
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.reference.req import Req
from kvpool.rules import Rules


class UnifiedTree(Protocol):
    """The parts of ``HiRadixCache`` the unified host tier uses."""

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
    def req_to_token_pool(self) -> ReqToTokenPool: ...

    @property
    def token_to_kv_pool_allocator(self) -> BaseTokenToKVPoolAllocator: ...

    @property
    def cache_controller(self) -> HiCacheController: ...

    @property
    def token_to_kv_pool_host(self) -> HostPoolProtocol[list[int]]: ...

    def insert(
        self,
        key: RadixKey,
        value: list[int] | None = None,
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
    """The unified host tier of one ``HiRadixCache`` (see the module docstring): the registry
    of host duplicates, the load-backs' host pins, chain backups, the checkpoint and the
    load-back."""

    def __init__(self, tree: UnifiedTree) -> None:
        self.tree = tree
        self.reset()

    def reset(self) -> None:
        """Forget the duplicate registry and the load-backs' host pins (frees nothing)."""
        self.full_host_duplicates: dict[int, HiTreeNode] = {}
        self.load_host_pins: dict[int, list[HiTreeNode]] = {}

    # ----------------------------------------------------------------- duplicates
    def track_duplicate(self, node: HiTreeNode) -> None:
        """Register ``node`` if it is a settled duplicate (device and complete host copy, no
        load in flight), else drop it; a registered node keeps its place. InvalidArgumentError
        unless ``node`` is a node of this tree."""
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
    def _reserve_host_write(self, node: HiTreeNode) -> list[int] | None:
        """Reserve host slots for ``node``'s device slots (evicting the host shortfall first)
        and queue the copy; None when there is no room."""
        tree = self.tree
        size = len(node.value)
        available = int(tree.token_to_kv_pool_host.available_size())
        if available < size:
            needed = size - available
            if tree.evict_host(needed) < needed:
                return None
        got = tree.cache_controller.write(node.value, node.node_id, flush=False)
        return None if got is None else list(got)

    def backup_chain(self, node: HiTreeNode, write_back: bool = False) -> int:
        """Back up ``node`` (write-through: after its unbacked ancestors, top-down) with queued
        copies; stops at the first without host room. Returns the host tokens of the last
        backup made (0: none, or the chain stopped). InvalidArgumentError (nothing changed)
        unless ``node`` is a node of this tree, on device and not backed up yet, and
        ``write_back`` a bool."""
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
                continue  # backed up by an earlier chain of the same insert
            host = self._reserve_host_write(n)
            if host is None:
                return 0
            n.host_value = host
            n.write_through_pending_id = n.node_id
            tree.ongoing_write_through[n.node_id] = (n, [n])
            if not write_back:
                tree.inc_lock_ref(n)
            written = len(host)
        return written

    # ----------------------------------------------------------------- checkpoint
    def checkpoint(self, req: Req, up_to: int, chunked: bool = False) -> list[int]:
        """SGLang 0.5.23's ``checkpoint_into_tree`` with the host tier: insert the page-aligned
        part of the first ``up_to`` tokens (the row's slots; hits by ``rules.hit_count``),
        freeing the duplicates past ``cache_protected_len``; when the page-aligned prompt is
        shorter but not empty, insert it again with ``priority + 1``, no hit and no free; match
        again, rewrite ``row[cache_protected_len:matched]`` with the tree's slots, move
        ``cache_protected_len`` and the lock to the matched node. Returns ``row[:up_to]`` as it
        is afterwards. Writes the inserts start are queued (the lifecycle issues them).
        Checked first (InvalidArgumentError, LockError): the request holds a row and a lock this
        tree can drop, ``up_to`` lies between its ``cache_protected_len`` and its tokens (and
        the row's width), ``chunked`` is a bool."""
        tree = self.tree
        up_to = as_count("up_to", up_to)
        chunked = as_bool("chunked", chunked)
        check_lock_holder("req", req, tree.root_node, HiTreeNode)
        high = min(len(req.all_token_ids), tree.req_to_token_pool.max_context_len)
        check_span("up_to", up_to, req.cache_protected_len, high)
        assert req.req_pool_idx is not None
        row = req.req_pool_idx
        kv: list[int] = list(tree.req_to_token_pool.read(row, 0, up_to))
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
        new_indices: list[int] = list(match.device_indices)
        tree.req_to_token_pool.write(
            (row, slice(protected, len(new_indices))), new_indices[protected:]
        )
        tree.dec_lock_ref(req.last_node)
        tree.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = len(new_indices)
        req.last_node = match.last_device_node
        return new_indices + kv[len(new_indices) :]

    # ----------------------------------------------------------------- load back
    def load_back(self, last_hit_node: HiTreeNode, mem_quota: int | None) -> list[int] | None:
        """Restore the host-only nodes from ``last_hit_node`` up to the first device node (see
        the module docstring); None when nothing moved. InvalidArgumentError (nothing changed)
        unless ``last_hit_node`` is a node of this tree and ``mem_quota`` (if given) a count."""
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
        last_hit_node.protect_host()  # the anchor's host lock, held until the acknowledgement
        for n in nodes_to_load:
            n.protect_host()  # SGLang locks the evicted segment for the call
        delta = tree.inc_lock_ref(ancestor)
        host_indices = [h for n in nodes_to_load for h in (n.host_value or [])]
        size = len(host_indices)
        allocator = tree.token_to_kv_pool_allocator
        refused = size < max(1, tree.load_back_threshold) or (
            mem_quota is not None and size - delta > mem_quota
        )
        if not refused and allocator.available_size() < size:
            tree.evict(size - allocator.available_size())
            refused = allocator.available_size() < size
        device: list[int] | None = None
        if not refused:
            got = tree.cache_controller.load(host_indices, last_hit_node.node_id)
            device = None if got is None else list(got)
        tree.dec_lock_ref(ancestor)
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
            if tree.write_policy == "write_back":
                n.load_back_pending_id = last_hit_node.node_id
        tree.evictable_size_ += size
        tree.ongoing_load_back[last_hit_node.node_id] = last_hit_node
        self.load_host_pins[last_hit_node.node_id] = [last_hit_node]
        tree.inc_lock_ref(last_hit_node)
        return device

    def finish_load_back(self, anchor: HiTreeNode) -> None:
        """A load's acknowledgement: drop the anchor's host lock, then walk the anchor's path
        (write-back: the nodes this load marked) clearing the marks and registering the
        duplicates. InvalidArgumentError (nothing changed) unless ``anchor`` is a node of this
        tree whose load is in flight (the tree drops its entry afterwards)."""
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
        """A split's upper half keeps the creation time of the node it was cut from (as the
        unified tree's splits), inherits its load mark and load-back host locks, and is
        registered if it is a duplicate. InvalidArgumentError (nothing changed) unless ``low``
        is a node of this tree and ``upper`` its parent (not the root)."""
        low = self.tree._tree_node("low", low)
        upper = self.tree._tree_node("upper", upper)
        if low.parent is not upper or upper is self.tree.root_node:
            raise InvalidArgumentError(
                f"upper {upper.node_id} is not the upper half of {low.node_id}"
            )
        upper.creation_time = low.creation_time
        upper.load_back_pending_id = low.load_back_pending_id
        for pins in self.load_host_pins.values():
            if low in pins:
                pins.append(upper)
                upper.protect_host()
        self.track_duplicate(upper)


__all__ = ["UnifiedHostTier", "UnifiedTree"]

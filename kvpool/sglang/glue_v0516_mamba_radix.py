"""SGLang 0.5.16's scheduler glue for a hybrid Mamba model with the radix cache on: the glue of
:mod:`kvpool.sglang.glue_v0516_mamba` over the tree 0.5.16's registry builds then, its own
FULL+MAMBA ``UnifiedRadixCache`` (:class:`SGLangUnified16MambaGlueTree`), whose release donates a
finished request's state slot and copies a chunk's (the MAMBA component's
``prepare_for_caching_req`` / ``cleanup_after_caching_req``). The request stand-in adds only the
fields that cache touches (:class:`MambaRadixGlueReqV0516`); the oracle pairs kvpool's model of
the same tree with 0.5.16's release (``Rules.mamba_tree="unified"``,
``release_path="finished_req"``: ``UnifiedMambaLifecycleCacheV0516``).
:func:`mamba_manager_v0516` picks the manager of a hybrid configuration: this one, the radix-off
one, or kvpool's lifecycle.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.optimized.req import Req
from kvpool.reference.mamba import lifecycle as mamba_lifecycle
from kvpool.reference.mamba.lifecycle import admission_headroom
from kvpool.sglang.cache_req import InsertedLen
from kvpool.sglang.glue_mamba import SGLangHybridTable
from kvpool.sglang.glue_v0516 import (
    KvRecords,
    SGLangGlueManagerV0516,
    covers_mamba_radix_v0516,
    covers_mamba_v0516,
)
from kvpool.sglang.glue_v0516_mamba import (
    ChunkMambaHooks,
    MambaGlueReqV0516,
    SGLangMambaGlueManagerV0516,
)
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.unified16_base import raw_node
from kvpool.sglang.unified16_mamba_radix import SGLangUnified16MambaRadixCache
from kvpool.sglang.unified_base import BASE
from kvpool.sglang.unified_mamba_radix import UnifiedMambaReqProxy
from kvpool.snapshot import MambaTreeSnapshot

UNIFIED16_MAMBA_TREE_CALLS = (
    "cache_finished_req",
    "cache_unfinished_req",
    "evict",
    "inc_lock_ref",
    "dec_lock_ref",
)
"""The methods of 0.5.16's FULL+MAMBA ``UnifiedRadixCache`` whose calls
:class:`SGLangUnified16MambaGlueTree` counts (``unified_radix_cache.NAME``, whoever calls them:
the glue, the cache itself, kvpool's lifecycle)."""


@dataclass(frozen=True)
class Unified16MambaGlueMatch:
    """A match as the twin's lifecycle reads it: the prefix's slots as an int64 tensor, the
    deepest node with a state, whether a copy-on-write was staged, SGLang's ``MatchResult``."""

    device_indices: torch.Tensor
    last_device_node: Any
    cow_staged: bool
    result: Any


class SGLangUnified16MambaGlueTree(SGLangUnified16MambaRadixCache):
    """SGLang 0.5.16's FULL+MAMBA ``UnifiedRadixCache`` over the manager's hybrid pool and token
    allocator, as :class:`SGLangMambaRadixGlueManagerV0516` uses it: ``impl`` is what 0.5.16's
    glue calls (``cache_finished_req`` / ``cache_unfinished_req``); the rest is the adapter's
    (:class:`~kvpool.sglang.unified16_mamba_radix.SGLangUnified16MambaRadixCache`: kvpool's
    node numbers, the match, the snapshot) with the lifecycle's own calls. Locks keep no
    receipt: 0.5.16's scheduler keeps only ``swa_uuid_for_lock`` of a lock (None for this
    component set) and its unified cache unlocks with ``DecLockRefParams(swa_uuid_for_lock)``,
    so every unlock of a request's lock, kvpool's too, goes without ``skip_lock_node_ids``."""

    def __init__(self, modules: SGLangModules, pool: Any, alloc: Any, page_size: int,
                 is_eagle: bool = False) -> None:  # fmt: skip
        super().__init__(modules, pool, alloc, page_size, is_eagle=is_eagle)
        self._inserted = InsertedLen()
        self.last_match: Any = None
        """SGLang's ``MatchResult`` of the last :meth:`match_prefix` (a copy-on-write at
        admission finishes it)."""
        self.calls: Counter[str] = Counter()
        """Calls of the methods in :data:`UNIFIED16_MAMBA_TREE_CALLS`."""
        for name in UNIFIED16_MAMBA_TREE_CALLS:
            setattr(self.impl, name, self._counted(name, getattr(self.impl, name)))

    def _counted(self, name: str, method: Any) -> Any:
        key = f"unified_radix_cache.{name}"

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[key] += 1
            return method(*args, **kwargs)

        return call

    def match_prefix(  # type: ignore[override]
        self, key: Any, req: Any = None, cow_mamba: bool = False
    ) -> Unified16MambaGlueMatch:
        """The adapter's match (``req`` and ``cow_mamba`` as SGLang's ``MatchPrefixParams``),
        its slots as a tensor; SGLang's result is kept (:attr:`last_match`)."""
        got = super().match_prefix(key, req, cow_mamba)
        self.last_match = got.result
        slots = torch.tensor(got.device_indices, dtype=torch.int64)
        return Unified16MambaGlueMatch(slots, got.last_device_node, got.cow_staged, got.result)

    def inc_lock_ref(self, node: Any) -> None:
        """SGLang's ``inc_lock_ref`` (the receipt is dropped, as 0.5.16's scheduler drops it);
        None: nothing."""
        if node is None:
            return
        with self._call():
            self.impl.inc_lock_ref(raw_node(node))

    def dec_lock_ref(self, node: Any) -> None:
        """SGLang's ``dec_lock_ref(node, DecLockRefParams(swa_uuid_for_lock=None))``, as its
        ``cache_finished_req`` unlocks a request's node; None: nothing."""
        if node is None:
            return
        params = self.modules.attr(BASE, "DecLockRefParams")(swa_uuid_for_lock=None)
        with self._call():
            self.impl.dec_lock_ref(raw_node(node), params)

    def evictable_size(self) -> int:
        return self.full_evictable_size()

    def protected_size(self) -> int:
        return self.full_protected_size()

    def _full_lru(self) -> tuple[int, ...]:
        """The KV LRU order (SGLang's FULL list), most recent first."""
        lru = self.impl.lru_lists[self._full]
        pt, ids, node = lru._pt, [], lru.head.lru_next[lru._pt]
        while node is not None and node is not lru.tail:
            ids.append(self.snapshot_id(int(node.id)))
            node = node.lru_next[pt]
        return tuple(ids)

    def snapshot(self) -> MambaTreeSnapshot:
        """The adapter's snapshot with the KV LRU order (SGLang's FULL list, which the adapter
        leaves out: its evictions read their own heap of it), marked ``unified`` (as kvpool's
        model of this tree marks its own: the ``"unified_mamba_tree"`` invariants)."""
        return dataclasses.replace(super().snapshot(), full_lru=self._full_lru(), unified=True)


class _LockFields:
    """0.5.16's per-request lock fields its unified cache writes: ``swa_uuid_for_lock`` (None
    for FULL+MAMBA) and ``swa_prefix_lock_released``."""

    __slots__ = ("released", "uuid")

    def __init__(self) -> None:
        self.uuid: int | None = None
        self.released = False


class MambaRadixGlueReqV0516(MambaGlueReqV0516):
    """:class:`MambaGlueReqV0516` with what 0.5.16's unified cache and its MAMBA component read
    and write besides: ``swa_uuid_for_lock`` and ``swa_prefix_lock_released`` (read / write,
    kept per request: the cache reads them with ``getattr`` defaults, so a stand-in without them
    would pass silently), ``mamba_last_track_seqlen`` (write None only: the component's cleanup
    after a chunk; kvpool models no track buffers with the tree, and nothing reads it) and
    ``last_node`` as SGLang's node object (kvpool keeps its numbered reference)."""

    __slots__ = ("lock",)
    lock: _LockFields

    def __init__(self, req: Any, records: KvRecords, lock: _LockFields, *args: Any) -> None:
        super().__init__(req, records, *args)
        object.__setattr__(self, "lock", lock)

    @property
    def swa_uuid_for_lock(self) -> int | None:
        return self.lock.uuid

    @swa_uuid_for_lock.setter
    def swa_uuid_for_lock(self, value: int | None) -> None:
        self.lock.uuid = None if value is None else int(value)

    @property
    def swa_prefix_lock_released(self) -> bool:
        return self.lock.released

    @swa_prefix_lock_released.setter
    def swa_prefix_lock_released(self, value: bool) -> None:
        self.lock.released = bool(value)

    @property
    def mamba_last_track_seqlen(self) -> None:
        raise AttributeError("SGLang read 'mamba_last_track_seqlen', which kvpool does not map")

    @mamba_last_track_seqlen.setter
    def mamba_last_track_seqlen(self, value: Any) -> None:
        if value is not None:
            raise AttributeError("SGLang wrote a track length; kvpool models no track buffers")

    @property
    def last_node(self) -> Any:
        node = self.req.last_node
        return None if node is None else raw_node(node)

    @last_node.setter
    def last_node(self, node: Any) -> None:
        self.req.last_node = None if node is None else self._node(node)


class RadixMambaHooks(ChunkMambaHooks):
    """The twin's Mamba hooks over SGLang's hybrid pool with 0.5.16's unified tree: the
    scheduler's part as :class:`ChunkMambaHooks`; the tree's parts are SGLang's, through
    ``manager`` (a match's copy-on-write, the copy-on-write at admission of a request
    ``extend`` matched itself, a waiting request's early free); admission's eviction is
    SGLang's ``alloc_req_slots`` inside ``alloc_for_extend``."""

    def __init__(self, pool: SGLangHybridTable, manager: SGLangMambaRadixGlueManagerV0516) -> None:
        super().__init__(pool)
        self.manager = manager

    def match(self, key: Any, req: Req) -> Any:
        return self.manager.match_with_cow(key, req)

    def stage_cow(self, reqs: Sequence[Req]) -> None:
        for req in reqs:
            if req.mamba_pool_idx is None and req.last_node is not None:
                self.manager.finish_cow(req, "mamba.cow_at_admission")

    def evict_for_admission(self, reqs: Sequence[Req]) -> None:
        """Nothing: SGLang's ``alloc_req_slots`` evicts inside ``alloc_for_extend``."""

    def reclaim_before_alloc(self, reqs: Sequence[Req]) -> None:
        """Nothing (0.5.23's ``ensure_mamba_capacity`` is not 0.5.16's)."""

    def release_waiting(self, req: Req) -> None:
        if req.mamba_pool_idx is not None:
            self.manager.early_free(req)


class SGLangMambaRadixGlueManagerV0516(SGLangMambaGlueManagerV0516):
    """The glue lifecycle of a hybrid model with the radix cache on over SGLang 0.5.16: its
    glue over its FULL+MAMBA ``UnifiedRadixCache`` (:class:`SGLangUnified16MambaGlueTree`),
    the hybrid pool and the token allocator (module docstring). The oracle is kvpool's
    lifecycle under ``Rules.for_sglang("0.5.16")`` (``mamba_tree="unified"`` with
    ``release_path="finished_req"``: :class:`~kvpool.reference.unified.mamba_release.
    UnifiedMambaLifecycleCacheV0516`). InvalidArgumentError for a configuration
    :func:`~kvpool.sglang.glue_v0516.covers_mamba_radix_v0516` refuses."""

    def __init__(
        self, config: PoolConfig, modules: SGLangModules, *, token_to_kv_pool_allocator: Any
    ) -> None:
        self._locks: dict[str, _LockFields] = {}
        self._matches: weakref.WeakKeyDictionary[Req, Any] = weakref.WeakKeyDictionary()
        """Each waiting request's last match (SGLang's ``MatchResult``)."""
        super().__init__(config, modules, token_to_kv_pool_allocator=token_to_kv_pool_allocator)
        self._modules = modules
        tree: Any = self.tree_cache
        self.glue_tree: SGLangUnified16MambaGlueTree = tree
        self.hooks.tree = tree  # its mamba_evictable_size counts at admission
        self.glue_calls.append(self.glue_tree.calls)

    @staticmethod
    def _covers(config: PoolConfig) -> bool:
        return covers_mamba_radix_v0516(config)

    def _build_tree(self, modules: SGLangModules, cfg: PoolConfig, pool: Any, alloc: Any) -> Any:
        """0.5.16's FULL+MAMBA ``UnifiedRadixCache`` (``registry.py`` lines 114-115)."""
        return SGLangUnified16MambaGlueTree(modules, pool, alloc, cfg.page_size,
                                            is_eagle=cfg.is_eagle)  # fmt: skip

    def _build_hooks(self, pool: Any) -> RadixMambaHooks:
        return RadixMambaHooks(pool, self)

    def _glue(self, req: Req) -> MambaRadixGlueReqV0516:  # type: ignore[override]
        self._bind()
        tree: Any = self.tree_cache
        lock = self._locks.setdefault(req.rid, _LockFields())
        return MambaRadixGlueReqV0516(req, self._records, lock, tree._inserted, None,
                                      tree.node_ref)  # fmt: skip

    # ----------------------------------------------------------------- matches
    def _match(self, req: Req, cow: bool, load_back: bool) -> int:
        """kvpool's match over SGLang's tree (0.5.16's ``init_next_round_input`` makes the same
        call, ``cow_mamba`` as the tree supports Mamba); the match is kept for a copy-on-write
        at admission."""
        found = super()._match(req, cow, load_back)
        self._matches[req] = self.glue_tree.last_match
        return found

    def _unmatch(self, req: Req) -> None:
        super()._unmatch(req)
        self._matches.pop(req, None)
        self._locks.pop(req.rid, None)

    def match_with_cow(self, key: Any, req: Req) -> Unified16MambaGlueMatch:
        """SGLang's ``match_prefix(cow_mamba=True, req)`` when the request holds a slot or one is
        free; with none free SGLang would assert when eviction cannot give one either, so the
        match goes without and :meth:`finish_cow` finishes it (kvpool's rule leaves the request
        without a slot when none can be had, ``Rules.mamba_slot_shortage``). A staged copy is
        made at once, as kvpool's lifecycle makes it."""
        pool: Any = self.req_to_token_pool
        free = int(pool.impl.mamba_allocator.available_size())
        cow = req.mamba_pool_idx is not None or free > 0
        result = self.glue_tree.match_prefix(key, req if cow else None, cow_mamba=cow)
        self._matches[req] = result.result
        if result.cow_staged:
            self.mamba_glue["mamba.cow_in_match"] += 1
            mamba_lifecycle.prepare_forward(pool, [req])
        elif not cow:
            self.finish_cow(req, "mamba.cow_after_match")
        return result

    def finish_cow(self, req: Req, label: str) -> None:
        """The MAMBA component's ``finalize_match_result`` with ``cow_mamba`` on the request's
        last match (what SGLang's match with ``cow_mamba`` runs last: a slot, evicting one state
        with the node locked when none is free, and the copy recorded), then the copy. Nothing
        when the node caches no state, or when no slot can be had even by eviction."""
        result = self._matches.get(req)
        if result is None:
            return
        tree = self.glue_tree
        node = result.best_match_node
        if node is tree.impl.root_node or tree._state(node) is None:
            return
        pool: Any = self.req_to_token_pool
        if req.mamba_pool_idx is None and int(pool.impl.mamba_allocator.available_size()) == 0:
            state_lock = int(node.component_data[int(tree._mamba)].lock_ref)
            own = 1 if state_lock == 0 else 0  # its own state is locked meanwhile
            if tree.mamba_evictable_size() - own <= 0:
                return
        params = self._modules.attr(BASE, "MatchPrefixParams")(
            key=None, cow_mamba=True, req=UnifiedMambaReqProxy(req)
        )
        with tree._call():
            tree.impl.components[tree._mamba].finalize_match_result(result, params, [], 0)
        self.mamba_glue[label] += 1
        mamba_lifecycle.prepare_forward(pool, [req])

    def early_free(self, req: Req) -> None:
        """A waiting request's copy-on-write slot back through SGLang's ``release_kv_cache``
        (its early path for a request holding a state but no row)."""
        tree: Any = self.tree_cache
        self._common.release_kv_cache(self._glue(req), tree.impl)
        req.mamba_cow_src_index = None
        req.mamba_needs_clear = False
        self.mamba_glue["mamba.early_free"] += 1

    # ----------------------------------------------------------------- primitives
    def alloc_for_extend(self, reqs: Sequence[Req], seq_lens: Sequence[int]) -> torch.Tensor:
        """As with the chunk cache; SGLang's ``alloc_req_slots`` now evicts cached states down
        to its headroom (``MAMBA_STATE_PER_REQ_PREFIX_CACHE`` per request) first."""
        pool: Any = self.req_to_token_pool
        free = int(pool.impl.mamba_allocator.available_size())
        if free < admission_headroom(len(reqs), True) and self.glue_tree.mamba_evictable_size():
            self.mamba_glue["mamba.headroom_evicts"] += 1
        return super().alloc_for_extend(reqs, seq_lens)

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """0.5.16's ``release_kv_cache``: the unified ``cache_finished_req`` (insert donating the
        state, or the request's KV and state freed), the over-allocation, the row; the tree
        manages states, so no ``free_mamba_cache`` after it. SGLang leaves a donated slot on the
        request it drops; kvpool forgets it with the other pool fields."""
        before = self._cached_states()
        SGLangGlueManagerV0516.release_kv_cache(self, req, is_insert)
        self._locks.pop(req.rid, None)
        self._matches.pop(req, None)
        if self._cached_states() > before:
            self.mamba_glue["mamba.state_donated"] += 1

    def _cached_states(self) -> int:
        impl = self.glue_tree.impl
        return int(impl.mamba_evictable_size()) + int(impl.mamba_protected_size())


def mamba_manager_v0516(
    config: PoolConfig, modules: SGLangModules, token_to_kv_pool_allocator: Any
) -> Any:
    """The manager of a hybrid configuration against SGLang 0.5.16: 0.5.16's glue where
    :func:`covers_mamba_v0516` (radix cache off: :class:`SGLangMambaGlueManagerV0516`) or
    :func:`~kvpool.sglang.glue_v0516.covers_mamba_radix_v0516` (on:
    :class:`SGLangMambaRadixGlueManagerV0516`) says so, else kvpool's lifecycle (its hybrid
    pool and Mamba radix cache, over SGLang's token allocator:
    :data:`~kvpool.sglang.glue_v0516.MAMBA_TREE_V0516`)."""
    if covers_mamba_v0516(config):
        return SGLangMambaGlueManagerV0516(
            config, modules, token_to_kv_pool_allocator=token_to_kv_pool_allocator
        )
    if covers_mamba_radix_v0516(config):
        return SGLangMambaRadixGlueManagerV0516(
            config, modules, token_to_kv_pool_allocator=token_to_kv_pool_allocator
        )
    from kvpool.optimized.lifecycle.memory_manager import MemoryManager

    return MemoryManager(
        config, checked=True, token_to_kv_pool_allocator=token_to_kv_pool_allocator
    )


__all__ = [
    "UNIFIED16_MAMBA_TREE_CALLS",
    "MambaRadixGlueReqV0516",
    "RadixMambaHooks",
    "SGLangMambaRadixGlueManagerV0516",
    "SGLangUnified16MambaGlueTree",
    "Unified16MambaGlueMatch",
    "mamba_manager_v0516",
]

"""SGLang 0.5.23's FULL+MAMBA unified tree inside the request lifecycle (``Rules.mamba_tree ==
"unified"``, with ``Rules.release_path == "checkpoint"``).

:class:`UnifiedMambaLifecycleCache` is the tree a hybrid
:class:`~kvpool.reference.lifecycle.memory_manager.MemoryManager` builds under SGLang 0.5.23's rules
when the radix cache is on: the component model
:class:`~kvpool.reference.unified.mamba_radix_cache.UnifiedMambaRadixCache` (tombstone leaves, one
eviction's two amounts counted together, a found state refreshed, the Mamba lock on tombstones,
segment frees) with the lifecycle's calls of
:class:`~kvpool.reference.mamba.radix_release.MambaLifecycleCache`, whose release paths it replaces
with 0.5.23's ``checkpoint`` / ``release_kv_cache`` (the strategy without track buffers, page size
1). Units: tokens for lengths and KV slots, one Mamba slot per state.

- ``cache_finished_req`` with insert (``release_kv_cache(checkpoint=True)`` of a finished
  request): the committed tokens go in with the request's KV and, as the end node's state, the
  request's own state slot (donated, not copied); the insert frees the request's duplicate KV
  (``free_segment``); when the end node already has a state, the request's slot goes back
  (``free_mamba_cache``) instead. The request's lock moves to the end node and, the request
  being released, is dropped at once: what remains is the old lock dropped. Nothing of
  ``[cache_protected_len, committed)`` is left to free: the row now names the tree's slots.
- ``cache_finished_req`` without insert (abort, retract; ``release_kv_cache(checkpoint=False)``):
  ``row[cache_protected_len:committed]`` goes back with ``free_segment`` (``free_kv_row``),
  the lock is dropped, then the state slot goes back (the tree's ``on_release``).
- ``cache_unfinished_req`` (a chunk boundary, ``checkpoint_kv_cache``): a fresh slot (one state
  evicted when none is free) receives a copy of the request's state and goes in with the
  prefilled tokens (back to the free list when the end node already has a state); the row is
  rewritten with the tree's slots of the path to the end node, the lock moves there. Unlike
  0.5.16 there is no second match (so no LRU refresh of the path).

The over-allocation past ``kv_committed_len`` and the row are the caller's
(:meth:`~kvpool.reference.lifecycle.primitives.LifecyclePrimitives.release_kv_cache`, segment
frees under ``release_path == "checkpoint"``).

**SGLang 0.5.16's release over its unified tree** (``Rules.mamba_tree == "unified"`` with
``Rules.release_path == "finished_req"``, :meth:`Rules.for_sglang` of 0.5.16):
:class:`UnifiedMambaLifecycleCacheV0516`. 0.5.16's ``UnifiedRadixCache.cache_finished_req`` /
``cache_unfinished_req`` (``unified_radix_cache.py`` lines 715-891) with the MAMBA component's
``prepare_for_caching_req`` / ``cleanup_after_caching_req`` (``mamba_component.py`` lines
349-472, no extra buffer, no int8 checkpoints) release as 0.5.16's ``MambaRadixCache`` did
(:class:`~kvpool.reference.mamba.radix_release.MambaLifecycleCache`), over the unified tree:

- a finish with insert donates the request's state slot as the end node's state (freed
  through ``free_mamba_cache`` when the node has one); without insert
  ``row[cache_protected_len:committed]`` goes back with one ``free`` (not ``free_segment``),
  then the state slot;
- a chunk boundary copies the state into a fresh slot (one state evicted when none is free:
  ``_alloc_mamba_slot``), inserts it with the chunk, then **matches again** (the path becomes
  the most recently used, in both orders), rewrites the row from the match and moves the lock
  to the matched node; the fresh slot goes back when the end node already had a state.

The order of the unlock and the state's free differs from 0.5.16's legacy tree (0.5.16's unified
cache unlocks first): neither changes what the other does. Admission is 0.5.16's
``alloc_req_slots`` (a headroom of three slots per request, as with the legacy tree), not
0.5.23's ``ensure_mamba_capacity`` (:attr:`UnifiedMambaLifecycleCache.exact_reclaim`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvpool.host_checks import as_bool
from kvpool.reference.mamba.radix_release import MambaLifecycleCache
from kvpool.reference.mamba.tree_node import MambaTreeNode
from kvpool.reference.radix_key import RadixKey
from kvpool.reference.req import Req
from kvpool.reference.unified.mamba_radix_cache import UnifiedMambaRadixCache
from kvpool.snapshot import MambaTreeSnapshot


class UnifiedMambaLifecycleCache(UnifiedMambaRadixCache, MambaLifecycleCache):
    """:class:`UnifiedMambaRadixCache` with SGLang 0.5.23's release path (module docstring)."""

    exact_reclaim = True
    """Admission evicts exactly the shortfall of the batch's slots before its KV (0.5.23's
    ``ensure_mamba_capacity``; the lifecycle's hooks read it)."""

    # Any: called with Req.last_node (typed TreeNode | None for every tree) holding this tree's
    # MambaTreeNode or None; MambaLifecycleCache's override takes Any for the same reason
    def inc_lock_ref(self, node: Any) -> None:
        """:meth:`UnifiedMambaRadixCache.inc_lock_ref`; None (never matched) and the root (SGLang's
        components lock no root) are no-ops."""
        if node is not None and node is not self.root_node:
            super().inc_lock_ref(node)

    # Any: as inc_lock_ref (Req.last_node's declared type is the plain tree's node)
    def dec_lock_ref(self, node: Any) -> None:
        """:meth:`UnifiedMambaRadixCache.dec_lock_ref`; None and the root are no-ops."""
        if node is not None and node is not self.root_node:
            super().dec_lock_ref(node)

    def _check_release_node(self, node: object) -> None:
        """:meth:`dec_lock_ref` skips None and the root; any other node must unlock."""
        if node is not None and node is not self.root_node:
            self._check_unlock(node)  # type: ignore[arg-type]

    def _inserted_node(self, key: RadixKey) -> MambaTreeNode:
        """The node an insert of ``key`` just ended on (SGLang's ``last_device_node``)."""
        node = self._end_node(key)
        assert node is not None  # the insert made the key end exactly on a node
        return node

    def _path_indices(self, node: MambaTreeNode) -> list[int]:
        """KV slots of the path from the root to ``node`` (``path_device_indices``)."""
        return [s for cur in reversed(self._path(node)) for s in cur.value]

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: list[int] | None = None
    ) -> None:
        """Checkpoint a finished request into the tree (``is_insert``) or free its KV past
        ``cache_protected_len``, drop its lock, and give its state to the tree or back (module
        docstring). Everything is checked first (:meth:`MambaLifecycleCache._check_release`,
        ``is_insert`` a bool): on an error (InvalidArgumentError and friends) nothing has
        changed."""
        as_bool("is_insert", is_insert)
        _, _, read = self._check_release(req, row_read, finished=True)
        assert req.req_pool_idx is not None and req.mamba_pool_idx is not None  # checked
        committed, protected = req.kv_committed_len, req.cache_protected_len
        kv = (  # row_read: the caller's read of row[:committed]
            self.req_to_token_pool.read(req.req_pool_idx, 0, committed) if read is None else read
        )
        pool = self.req_to_token_pool
        if is_insert and committed > 0:
            key = RadixKey(req.all_token_ids[:committed], req.extra_key)
            _, mamba_exist = self.insert(key, kv, req.mamba_pool_idx, protected)
            # the lock moves to the end node and is dropped there with the release
            self.dec_lock_ref(req.last_node)
            req.cache_protected_len = committed
            if mamba_exist:
                pool.free_mamba_cache(req)
            else:  # the slot is the end node's state now
                req.mamba_pool_idx = None
                req.mamba_needs_clear = False
                req.mamba_cow_src_index = None
            return
        if committed > protected:
            self.token_to_kv_pool_allocator.free_segment(kv[protected:committed], protected)
        self.dec_lock_ref(req.last_node)
        pool.free_mamba_cache(req)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: list[int] | None = None
    ) -> None:
        """A chunk boundary: cache ``fill_ids`` with a copy of the request's state, rewrite
        ``row[cache_protected_len:len(fill_ids)]`` with the tree's slots, move the lock to the
        end node and set ``prefix_indices`` / ``cache_protected_len`` (module docstring). The
        row and the request's own slot stay; ``chunked`` is accepted for the lifecycle's call.
        Everything is checked first (as :meth:`cache_finished_req`)."""
        as_bool("chunked", chunked)
        _, _, read = self._check_release(req, row_read, finished=False)
        assert req.req_pool_idx is not None and req.mamba_pool_idx is not None  # checked
        row, tokens = req.req_pool_idx, list(req.fill_ids)
        kv = self.req_to_token_pool.read(row, 0, len(tokens)) if read is None else read
        donated = self.alloc_mamba_slot()
        self.req_to_token_pool.mamba_pool.copy_from([req.mamba_pool_idx], [donated])
        key = RadixKey(tokens, req.extra_key)
        _, mamba_exist = self.insert(key, kv, donated, req.cache_protected_len)
        if mamba_exist:
            self.req_to_token_pool.mamba_allocator.free([donated])
        node = self._inserted_node(key)
        new_indices, protected = self._path_indices(node), req.cache_protected_len
        self.req_to_token_pool.write(
            (row, slice(protected, len(new_indices))), new_indices[protected:]
        )
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(node)
        req.prefix_indices = new_indices + kv[len(new_indices) :]
        req.cache_protected_len = len(new_indices)
        # Any: Req.last_node is typed TreeNode | None; the request's node is this tree's
        last: Any = node
        req.last_node = last

    def snapshot(self) -> MambaTreeSnapshot:
        """:meth:`UnifiedMambaRadixCache.snapshot` marked ``unified`` (the pool then checks it
        with the ``"unified_mamba_tree"`` invariants)."""
        return dataclasses.replace(super().snapshot(), unified=True)


class UnifiedMambaLifecycleCacheV0516(UnifiedMambaLifecycleCache):
    """The unified tree with SGLang 0.5.16's release path (module docstring): the legacy Mamba
    tree's ``cache_finished_req`` / ``cache_unfinished_req`` over this tree's insert, match,
    locks and eviction."""

    exact_reclaim = False
    """0.5.16 admits with ``alloc_req_slots``' headroom instead (the hooks'
    ``evict_for_admission``)."""

    def _free_kv(self, slots: list[int]) -> None:
        """One ``free`` (0.5.16's cache frees through ``allocator.free``; 0.5.16's allocator has
        no ``free_segment``)."""
        self.token_to_kv_pool_allocator.free(slots)

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: list[int] | None = None
    ) -> None:
        """0.5.16's ``cache_finished_req``: :meth:`MambaLifecycleCache.cache_finished_req` over
        this tree (insert donating the state, or one ``free`` of the KV past
        ``cache_protected_len`` and the state slot back; the lock dropped).
        InvalidArgumentError (nothing changed) without a row or a Mamba slot."""
        MambaLifecycleCache.cache_finished_req(self, req, is_insert, row_read)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: list[int] | None = None
    ) -> None:
        """0.5.16's ``cache_unfinished_req``: :meth:`MambaLifecycleCache.cache_unfinished_req`
        over this tree (the state copied into a fresh slot and inserted with the chunk, a second
        match, the row rewritten from it, the lock moved to the matched node).
        InvalidArgumentError (nothing changed) without a row or a Mamba slot."""
        MambaLifecycleCache.cache_unfinished_req(self, req, chunked, row_read)


__all__ = ["UnifiedMambaLifecycleCache", "UnifiedMambaLifecycleCacheV0516"]

"""The Mamba radix cache inside the request lifecycle: how a hybrid request's KV and state
enter the tree and leave its row.

:class:`MambaLifecycleCache` is the :class:`~kvpool.reference.mamba.radix_cache.MambaRadixCache`
that a hybrid :class:`~kvpool.reference.lifecycle.memory_manager.MemoryManager` builds when the
radix cache is on. It adds what the lifecycle calls on any tree cache (``evictable_size``,
``cache_finished_req``, ``cache_unfinished_req``, locks that accept no node) with SGLang 0.5.16's
behaviour for the strategy without track buffers (page size 1). Units: tokens for lengths and KV
slots, one Mamba slot per state.

- ``cache_finished_req`` with insert: the request's committed tokens go in with its KV and,
  as the new node's checkpoint, the request's own state slot (donated, not copied); when the
  end node already has a state, the request's slot is freed instead. Without insert: the KV past
  ``cache_protected_len`` and the state slot are freed. Then the request's node is unlocked.
- ``cache_unfinished_req`` (between prefill chunks): a fresh slot (one state evicted when none
  is free) receives a copy of the request's state and goes into the tree with the prefilled
  tokens (freed again when the end node already has a state); the request keeps its own slot,
  re-matches and moves its lock to the new node.

A chunk's fresh slot cannot be missing: the lifecycle's admission counts it (see
:meth:`~kvpool.reference.lifecycle.mamba_hooks.MambaHooks.check_admission`).
"""

from __future__ import annotations

from typing import Any, cast

from kvpool.errors import InvalidArgumentError, OutOfMemoryError
from kvpool.reference.mamba.radix_cache import MambaRadixCache
from kvpool.reference.mamba.tree_node import MambaTreeNode
from kvpool.reference.radix_key import RadixKey
from kvpool.reference.req import Req


class MambaLifecycleCache(MambaRadixCache):
    """A :class:`MambaRadixCache` with the lifecycle's release path (see the module
    docstring)."""

    def evictable_size(self) -> int:
        """Unlocked KV in the tree (tokens): what KV eviction can free."""
        return self.full_evictable_size_

    def protected_size(self) -> int:
        """Locked KV in the tree (tokens)."""
        return self.full_protected_size_

    def inc_lock_ref(self, node: object) -> None:
        """:meth:`MambaRadixCache.inc_lock_ref` of a :class:`MambaTreeNode` (a request's
        ``last_node``); None (a request never matched) is a no-op."""
        if node is not None:
            super().inc_lock_ref(cast(MambaTreeNode, node))  # a request's node is this tree's

    def dec_lock_ref(self, node: object) -> None:
        """:meth:`MambaRadixCache.dec_lock_ref`; None is a no-op."""
        if node is not None:
            super().dec_lock_ref(cast(MambaTreeNode, node))

    def alloc_mamba_slot(self) -> int:
        """One Mamba slot, evicting one cached state when none is free (SGLang's
        ``_alloc_mamba_slot``); OutOfMemoryError when none can be had (SGLang asserts)."""
        got = self.req_to_token_pool.mamba_allocator.alloc(1)
        if got is None:
            self.evict_mamba(1)
            got = self.req_to_token_pool.mamba_allocator.alloc(1)
        if got is None:
            raise OutOfMemoryError("no Mamba slot for the tree's checkpoint")
        return got[0]

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: list[int] | None = None
    ) -> None:
        """Hand a finished request's committed KV and state to the tree (or free them), then
        unlock its node (see the module docstring). Over-allocation past ``kv_committed_len``
        and the row are the caller's."""
        if req.req_pool_idx is None or req.mamba_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row or no Mamba slot")
        committed = req.kv_committed_len
        kv = (  # row_read: the caller's read of row[:committed]
            self.req_to_token_pool.read(req.req_pool_idx, 0, committed)
            if row_read is None
            else list(row_read)
        )
        pool = self.req_to_token_pool
        if is_insert:
            key = RadixKey(req.all_token_ids[:committed], req.extra_key)
            _, mamba_exist = self.insert(key, kv, req.mamba_pool_idx, req.cache_protected_len)
        else:
            self.token_to_kv_pool_allocator.free(kv[req.cache_protected_len :])
            mamba_exist = True
        if mamba_exist:
            pool.free_mamba_cache(req)
        else:  # the slot is the tree's checkpoint now
            req.mamba_pool_idx = None
            req.mamba_needs_clear = False
            req.mamba_cow_src_index = None
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: list[int] | None = None
    ) -> None:
        """Between prefill chunks: cache ``fill_ids`` with a copy of the request's state,
        re-match, rewrite ``row[cache_protected_len:matched]`` with the tree's slots, move the
        lock and set ``prefix_indices`` / ``cache_protected_len``. The row and the request's
        own state slot stay. ``chunked`` is accepted for the lifecycle's call (the Mamba tree
        counts no hits)."""
        if req.req_pool_idx is None or req.mamba_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row or no Mamba slot")
        row, tokens = req.req_pool_idx, list(req.fill_ids)
        kv = (
            self.req_to_token_pool.read(row, 0, len(tokens)) if row_read is None else list(row_read)
        )
        donated = self.alloc_mamba_slot()
        self.req_to_token_pool.mamba_pool.copy_from([req.mamba_pool_idx], [donated])
        key = RadixKey(tokens, req.extra_key)
        _, mamba_exist = self.insert(key, kv, donated, req.cache_protected_len)
        if mamba_exist:
            self.req_to_token_pool.mamba_allocator.free([donated])
        match = self.match_prefix(key)
        new_indices, protected = match.device_indices, req.cache_protected_len
        self.req_to_token_pool.write(
            (row, slice(protected, len(new_indices))), new_indices[protected:]
        )
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.prefix_indices = new_indices + kv[len(new_indices) :]
        req.cache_protected_len = len(new_indices)
        # Any: Req types last_node as the radix tree's node; a hybrid request keeps this tree's
        last: Any = match.last_device_node
        req.last_node = last


__all__ = ["MambaLifecycleCache"]

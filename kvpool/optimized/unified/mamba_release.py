"""SGLang 0.5.23's FULL+MAMBA unified tree inside the request lifecycle (optimized twin).

Same contract, results and errors as :mod:`kvpool.reference.unified.mamba_release` (read its
docstring); KV slots are int64 tensors, keys come from the request's cached token array.
:class:`UnifiedMambaLifecycleCacheV0516` is SGLang 0.5.16's release over the same tree, as the
reference's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kvpool.host_checks import as_bool
from kvpool.optimized.mamba.radix_release import MambaLifecycleCache
from kvpool.optimized.mamba.tree_node import MambaTreeNode
from kvpool.optimized.radix_key import RadixKey, req_key
from kvpool.optimized.req import Req
from kvpool.optimized.unified.mamba_radix_cache import UnifiedMambaRadixCache
from kvpool.snapshot import MambaTreeSnapshot


class UnifiedMambaLifecycleCache(UnifiedMambaRadixCache, MambaLifecycleCache):
    """:class:`UnifiedMambaRadixCache` with SGLang 0.5.23's release path."""

    exact_reclaim = True
    """Admission evicts exactly the shortfall (0.5.23's ``ensure_mamba_capacity``)."""

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
        """The node an insert of ``key`` just ended on."""
        node = self._end_node(key)
        assert node is not None  # the insert made the key end exactly on a node
        return node

    def _path_indices(self, node: MambaTreeNode) -> torch.Tensor:
        """KV slots of the path from the root to ``node``."""
        parts = [cur.value for cur in reversed(self._path(node))]
        return torch.cat(parts) if parts else self._empty()

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: torch.Tensor | None = None
    ) -> None:
        """Checkpoint a finished request into the tree or free its KV past
        ``cache_protected_len``, drop its lock, give its state to the tree or back. Everything
        is checked first (``is_insert`` a bool): on an error nothing has changed."""
        as_bool("is_insert", is_insert)
        # row_read: the caller's read of row[:committed] (one gather for the batch)
        kv = self._check_release(req, row_read, finished=True)
        assert req.req_pool_idx is not None and req.mamba_pool_idx is not None  # checked
        committed, protected = req.kv_committed_len, req.cache_protected_len
        pool = self.req_to_token_pool
        if is_insert and committed > 0:
            key = req_key(req, committed)
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
        self, req: Req, chunked: bool = False, row_read: torch.Tensor | None = None
    ) -> None:
        """A chunk boundary: cache ``fill_ids`` with a copy of the request's state, rewrite the
        row with the tree's slots, move the lock to the end node (no second match). Everything
        is checked first (as :meth:`cache_finished_req`)."""
        as_bool("chunked", chunked)
        kv = self._check_release(req, row_read, finished=False)
        assert req.req_pool_idx is not None and req.mamba_pool_idx is not None  # checked
        row, num_tokens = req.req_pool_idx, len(req.fill_ids)
        donated = self.alloc_mamba_slot()
        self.req_to_token_pool.mamba_pool.copy_from([req.mamba_pool_idx], [donated])
        key = req_key(req, num_tokens)
        _, mamba_exist = self.insert(key, kv, donated, req.cache_protected_len)
        if mamba_exist:
            self.req_to_token_pool.mamba_allocator.free([donated])
        node = self._inserted_node(key)
        new_indices, protected = self._path_indices(node), req.cache_protected_len
        num_new = len(new_indices)
        self.req_to_token_pool.write((row, slice(protected, num_new)), new_indices[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(node)
        req.prefix_indices = torch.cat((new_indices, kv[num_new:]))
        req.cache_protected_len = num_new
        # Any: Req.last_node is typed TreeNode | None; the request's node is this tree's
        last: Any = node
        req.last_node = last

    def snapshot(self) -> MambaTreeSnapshot:
        """The snapshot marked ``unified``."""
        return dataclasses.replace(super().snapshot(), unified=True)


class UnifiedMambaLifecycleCacheV0516(UnifiedMambaLifecycleCache):
    """The unified tree with SGLang 0.5.16's release path: the legacy Mamba tree's
    ``cache_finished_req`` / ``cache_unfinished_req`` (a chunk's second match) over this tree."""

    exact_reclaim = False
    """0.5.16 admits with ``alloc_req_slots``' headroom instead."""

    def _free_kv(self, slots: torch.Tensor) -> None:
        """One ``free`` (0.5.16's cache frees through ``allocator.free``; 0.5.16's allocator has
        no ``free_segment``)."""
        self.token_to_kv_pool_allocator.free(slots)

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: torch.Tensor | None = None
    ) -> None:
        """:meth:`MambaLifecycleCache.cache_finished_req` over this tree."""
        MambaLifecycleCache.cache_finished_req(self, req, is_insert, row_read)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: torch.Tensor | None = None
    ) -> None:
        """:meth:`MambaLifecycleCache.cache_unfinished_req` over this tree (a second match)."""
        MambaLifecycleCache.cache_unfinished_req(self, req, chunked, row_read)


__all__ = ["UnifiedMambaLifecycleCache", "UnifiedMambaLifecycleCacheV0516"]

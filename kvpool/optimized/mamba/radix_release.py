"""The Mamba radix cache inside the request lifecycle (optimized twin).

Same contract, results and errors as :mod:`kvpool.reference.mamba.radix_release` (read its
docstring); KV slots are int64 tensors, keys come from the request's cached token array.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from kvpool.errors import InvalidArgumentError, OutOfMemoryError
from kvpool.host_checks import as_bool
from kvpool.optimized.mamba.radix_cache import MambaRadixCache
from kvpool.optimized.mamba.tree_node import MambaTreeNode
from kvpool.optimized.radix_key import req_key
from kvpool.optimized.req import Req
from kvpool.reference.mamba.radix_release import check_release_req


class MambaLifecycleCache(MambaRadixCache):
    """A :class:`MambaRadixCache` with the lifecycle's release path."""

    def evictable_size(self) -> int:
        """Unlocked KV in the tree (tokens): what KV eviction can free."""
        return self.full_evictable_size_

    def protected_size(self) -> int:
        """Locked KV in the tree (tokens)."""
        return self.full_protected_size_

    def inc_lock_ref(self, node: object) -> None:
        """:meth:`MambaRadixCache.inc_lock_ref`; None (a request never matched) is a no-op."""
        if node is not None:
            super().inc_lock_ref(cast(MambaTreeNode, node))  # a request's node is this tree's

    def dec_lock_ref(self, node: object) -> None:
        """:meth:`MambaRadixCache.dec_lock_ref`; None is a no-op."""
        if node is not None:
            super().dec_lock_ref(cast(MambaTreeNode, node))

    def alloc_mamba_slot(self) -> int:
        """One Mamba slot, evicting one cached state when none is free; OutOfMemoryError when
        none can be had."""
        got = self.req_to_token_pool.mamba_allocator.alloc(1)
        if got is None:
            self.evict_mamba(1)
            got = self.req_to_token_pool.mamba_allocator.alloc(1)
        if got is None:
            raise OutOfMemoryError("no Mamba slot for the tree's checkpoint")
        return got[0]

    def _check_release(self, req: object, row_read: object, finished: bool) -> torch.Tensor:
        """A release's arguments checked before any change (see the reference: the request,
        its row held, its Mamba slot held, its node one this tree can unlock; ``row_read`` a
        1-D integer index of one slot per released token, in range; the KV handed over held,
        in checked mode). Returns the KV slots of the released tokens."""
        pool = self.req_to_token_pool
        stop, protected = check_release_req(req, pool.max_context_len, finished, False)
        r = cast(Req, req)  # a request: its fields were checked above
        row = pool._check_row(r.req_pool_idx)
        if pool._free_set[row]:  # a host byte per row
            raise InvalidArgumentError(f"req.req_pool_idx: row {row} is free")
        self._check_state_slot("req.mamba_pool_idx", r.mamba_pool_idx)
        self._check_release_node(r.last_node)
        if row_read is None:
            kv = self._read_row(row, stop)
        else:
            kv = self._check_slots("row_read", row_read)
            if len(kv) != stop:
                raise InvalidArgumentError(f"row_read: {len(kv)} slots for {stop} tokens")
        self._check_held_kv("the request's KV", kv[protected:])
        return kv

    def _check_release_node(self, node: object) -> None:
        """The request's node can be unlocked by :meth:`dec_lock_ref` (None: never matched)."""
        if node is not None:
            self._check_unlock(cast(MambaTreeNode, node))

    def _read_row(self, row: int, stop: int) -> torch.Tensor:
        kv: torch.Tensor = self.req_to_token_pool.read(row, 0, stop)
        return kv.to(torch.int64)

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: torch.Tensor | None = None
    ) -> None:
        """Hand a finished request's committed KV and state to the tree (or free them), then
        unlock its node. Everything is checked first (:meth:`_check_release`; ``is_insert`` a
        bool): on an error nothing has changed."""
        as_bool("is_insert", is_insert)
        # row_read: the caller's read of row[:committed] (one gather for the batch)
        kv = self._check_release(req, row_read, finished=True)
        assert req.req_pool_idx is not None and req.mamba_pool_idx is not None  # checked
        committed = req.kv_committed_len
        if is_insert:
            key = req_key(req, committed)
            _, mamba_exist = self.insert(key, kv, req.mamba_pool_idx, req.cache_protected_len)
        else:
            self.token_to_kv_pool_allocator.free(kv[req.cache_protected_len :])
            mamba_exist = True
        if mamba_exist:
            self.req_to_token_pool.free_mamba_cache(req)
        else:  # the slot is the tree's checkpoint now
            req.mamba_pool_idx = None
            req.mamba_needs_clear = False
            req.mamba_cow_src_index = None
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: torch.Tensor | None = None
    ) -> None:
        """Between prefill chunks: cache ``fill_ids`` with a copy of the request's state,
        re-match, rewrite the row, move the lock; the request keeps its row and slot.
        Everything is checked first (as :meth:`cache_finished_req`)."""
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
        match = self.match_prefix(key)
        new_indices, protected = match.device_indices, req.cache_protected_len
        num_new = len(new_indices)
        self.req_to_token_pool.write((row, slice(protected, num_new)), new_indices[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.prefix_indices = torch.cat((new_indices, kv[num_new:]))
        req.cache_protected_len = num_new
        # Any: Req types last_node as the radix tree's node; a hybrid request keeps this tree's
        last: Any = match.last_device_node
        req.last_node = last


__all__ = ["MambaLifecycleCache"]

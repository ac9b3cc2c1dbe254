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
from kvpool.host_checks import as_bool, as_count, token_list
from kvpool.reference.mamba.radix_cache import MambaRadixCache
from kvpool.reference.mamba.tree_node import MambaTreeNode
from kvpool.reference.radix_key import RadixKey, check_tree_slots, tree_slot_limit
from kvpool.reference.req import Req

RELEASE_FIELDS = (
    "rid",
    "req_pool_idx",
    "mamba_pool_idx",
    "kv_committed_len",
    "cache_protected_len",
    "fill_ids",
    "origin_input_ids",
    "output_ids",
    "extra_key",
    "last_node",
)
"""What a release reads of a request."""


def check_release_req(
    req: object, max_context_len: int, finished: bool, check_tokens: bool = True
) -> tuple[int, int]:
    """The lengths a release of ``req`` reads, checked (pure, both twins): it has
    :data:`RELEASE_FIELDS` and holds a row and a Mamba slot (InvalidArgumentError otherwise),
    ``cache_protected_len <= kv_committed_len <= len(all_token_ids)`` and
    ``kv_committed_len <= max_context_len`` as ints >= 0, and (a chunk boundary) ``fill_ids``
    token ids (``check_tokens``; the twin reads them through its key arrays) no longer than
    the row. Returns ``(stop, protected)``: the tokens the release
    covers (committed, or ``len(fill_ids)``) and ``cache_protected_len``."""
    missing = [f for f in RELEASE_FIELDS if not hasattr(req, f)]
    if missing:
        raise InvalidArgumentError(f"req must be a request (no {missing[0]}), got {req!r}")
    r = cast(Req, req)  # a request: its fields were checked above
    if r.req_pool_idx is None or r.mamba_pool_idx is None:
        raise InvalidArgumentError(f"request {r.rid!r} holds no row or no Mamba slot")
    committed = as_count("req.kv_committed_len", r.kv_committed_len)
    protected = as_count("req.cache_protected_len", r.cache_protected_len)
    total = len(r.origin_input_ids) + len(r.output_ids)
    if committed > total or committed > max_context_len:
        raise InvalidArgumentError(
            f"req.kv_committed_len {committed} past the request's {total} tokens or the "
            f"row's {max_context_len} columns"
        )
    stop = committed
    if not finished:
        stop = len(token_list("req.fill_ids", r.fill_ids) if check_tokens else r.fill_ids)
        if stop > max_context_len:
            raise InvalidArgumentError(f"req.fill_ids: {stop} tokens past {max_context_len}")
    if protected > min(committed, stop):
        raise InvalidArgumentError(
            f"req.cache_protected_len {protected} past kv_committed_len {committed} or the "
            f"{stop} tokens released"
        )
    return stop, protected


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

    def _check_release(
        self, req: object, row_read: object, finished: bool
    ) -> tuple[int, int, list[int] | None]:
        """A release's arguments checked before any change: the request
        (:func:`check_release_req`; its row held, its Mamba slot one it holds, its node one
        this tree can unlock), ``row_read`` (None, or one slot per released token, each in
        range) and the KV it hands over (``[cache_protected_len:]``, held: DoubleFreeError).
        Returns ``(stop, protected, row_read as ints)``."""
        pool = self.req_to_token_pool
        stop, protected = check_release_req(req, pool.max_context_len, finished)
        r = cast(Req, req)  # a request: its fields were checked above
        row = pool._check_row(r.req_pool_idx)
        if row in pool._free_set:
            raise InvalidArgumentError(f"req.req_pool_idx: row {row} is free")
        self._check_state_slot("req.mamba_pool_idx", r.mamba_pool_idx)
        self._check_release_node(r.last_node)
        limit = tree_slot_limit(self.token_to_kv_pool_allocator)
        if row_read is None:
            slots = check_tree_slots(pool.read(row, 0, stop), limit)
            read = None
        else:
            slots = read = check_tree_slots(row_read, limit)  # type: ignore[arg-type]
            if len(read) != stop:
                raise InvalidArgumentError(f"row_read: {len(read)} slots for {stop} tokens")
        self._check_held_kv("the request's KV", slots[protected:])
        return stop, protected, read

    def _check_release_node(self, node: object) -> None:
        """The request's node can be unlocked by :meth:`dec_lock_ref` (None: never matched)."""
        if node is not None:
            self._check_unlock(cast(MambaTreeNode, node))

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
        and the row are the caller's. Everything is checked first (:meth:`_check_release`;
        ``is_insert`` a bool): on an error nothing has changed."""
        as_bool("is_insert", is_insert)
        _, _, read = self._check_release(req, row_read, finished=True)
        assert req.req_pool_idx is not None and req.mamba_pool_idx is not None  # checked
        committed = req.kv_committed_len
        kv = (  # row_read: the caller's read of row[:committed]
            self.req_to_token_pool.read(req.req_pool_idx, 0, committed) if read is None else read
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
        counts no hits). Everything is checked first (:meth:`_check_release`; ``chunked`` a
        bool): on an error nothing has changed."""
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


__all__ = ["RELEASE_FIELDS", "MambaLifecycleCache", "check_release_req"]

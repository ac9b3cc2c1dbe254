"""The release path of the radix cache: how a request's KV enters the tree and leaves its row.

``cache_finished_req`` (a request finishes), ``cache_unfinished_req`` (between prefill chunks)
and, under ``Rules.release_path == "checkpoint"``, SGLang 0.5.23's ``checkpoint``; the slots the
tree owned go back through ``Rules.tree_free``. A mixin of
:class:`~kvpool.reference.radix.radix_cache.RadixCache` (which provides the tree, its pools and
``insert`` / ``match_prefix`` / the locks); mirrored in both twins.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpool.constants import floor_align
from kvpool.errors import InvalidArgumentError
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.reference.req import Req
from kvpool.rules import Rules


class RadixRelease:
    """The release-path methods of :class:`~kvpool.reference.radix.radix_cache.RadixCache`."""

    page_size: int
    disable: bool
    rules: Rules
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool_allocator: BaseTokenToKVPoolAllocator
    insert: Callable[..., int]
    match_prefix: Callable[[RadixKey], MatchResult]
    inc_lock_ref: Callable[[TreeNode | None], int]
    dec_lock_ref: Callable[[TreeNode | None], int]

    def _free_tree_slots(self, slots: list[int], start_pos: int) -> None:
        """Return slots the tree owned (an evicted node's, a finished request's duplicates
        starting at column ``start_pos``) as ``rules.tree_free`` says: ``free`` or SGLang
        0.5.23's ``free_segment``."""
        if self.rules.tree_free == "segment":
            self.token_to_kv_pool_allocator.free_segment(slots, start_pos)
        else:
            self.token_to_kv_pool_allocator.free(slots)

    def _insert_req(self, req: Req, key: RadixKey, value: list[int], chunked: bool) -> int:
        """Insert ``key`` for ``req``, counting hits as ``rules.hit_count`` says (``chunked``, or
        past ``req.cache_inserted_len``, which then rises to the key's length)."""
        if self.rules.hit_count == "chunked":
            return self.insert(key, value, priority=req.priority, chunked=chunked)
        done = self.insert(key, value, priority=req.priority, inserted_len=req.cache_inserted_len)
        req.cache_inserted_len = max(req.cache_inserted_len, len(key))
        return done

    def checkpoint(self, req: Req, up_to: int, chunked: bool = False) -> list[int]:
        """SGLang 0.5.23's ``checkpoint``: insert the page-aligned part of the first ``up_to``
        tokens (the row's slots; hits by ``rules.hit_count`` and ``chunked``); when the
        page-aligned prompt is shorter but not empty, insert it again with ``priority + 1`` and
        no hit (the leaf splits at the prompt boundary); free the duplicates
        ``row[cache_protected_len:already cached]`` (``rules.tree_free``); match the key again,
        rewrite ``row[cache_protected_len:matched]`` with the tree's slots, and move
        ``cache_protected_len`` (to the key's length) and the lock to the matched node. Returns
        ``row[:up_to]`` as it is afterwards."""
        assert req.req_pool_idx is not None
        row = req.req_pool_idx
        kv = self.req_to_token_pool.read(row, 0, up_to)
        tokens = req.all_token_ids[:up_to]
        aligned = floor_align(up_to, self.page_size)
        key = RadixKey(tokens[:aligned], req.extra_key)
        new_prefix_len = self._insert_req(req, key, kv[:aligned], chunked)
        prompt = floor_align(min(up_to, len(req.origin_input_ids)), self.page_size)
        if 0 < prompt < aligned:
            self.insert(key[:prompt], kv[:prompt], priority=req.priority + 1, inserted_len=prompt)
        protected = req.cache_protected_len
        self._free_tree_slots(kv[protected:new_prefix_len], protected)
        match = self.match_prefix(key)
        new_indices = match.device_indices
        self.req_to_token_pool.write(
            (row, slice(protected, len(new_indices))), new_indices[protected:]
        )
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = len(new_indices)
        req.last_node = match.last_device_node
        out: list[int] = new_indices + kv[len(new_indices) :]
        return out

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: list[int] | None = None
    ) -> None:
        """Hand a finished request's committed KV to the tree (or free it), then unlock its node.

        ``kv = row[:committed]``. ``rules.release_path == "finished_req"`` (SGLang 0.5.16): with
        insert, insert the page-aligned part, free the duplicates
        ``kv[cache_protected_len:new_prefix_len]``, then (a second ``free``, as SGLang) the
        unaligned tail ``kv[aligned:committed]`` (its whole page); without, free
        ``kv[cache_protected_len:aligned]``, then the tail; disabled, one free of
        ``kv[cache_protected_len:committed]``. ``"checkpoint"`` (SGLang 0.5.23): with insert,
        :meth:`checkpoint` up to ``committed``; then (``free_kv_row``) one ``free_segment`` of
        ``row[cache_protected_len:committed]``, disabled or not. Over-allocation past
        ``ceil_align(committed)`` is the caller's (``release_kv_cache``).

        ``row_read``: ``row[:committed]`` as the caller already read it, used instead of a read
        of the row (under ``"checkpoint"`` only without insert: the checkpoint rewrites the
        row); the twin's lifecycle passes its batch read, this lifecycle passes none."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        committed = req.kv_committed_len
        if self.rules.release_path == "checkpoint":
            rewritten = is_insert and not self.disable
            if rewritten:
                self.checkpoint(req, committed)
            if row_read is not None and not rewritten:
                kv = list(row_read[req.cache_protected_len : committed])
            else:
                kv = self.req_to_token_pool.read(
                    req.req_pool_idx, req.cache_protected_len, committed
                )
            self.token_to_kv_pool_allocator.free_segment(kv, req.cache_protected_len)
            self.dec_lock_ref(req.last_node)
            return
        if row_read is not None:
            kv = list(row_read[:committed])
        else:
            kv = self.req_to_token_pool.read(req.req_pool_idx, 0, committed)
        free = self.token_to_kv_pool_allocator.free
        if self.disable:
            free(kv[req.cache_protected_len : committed])
            return
        aligned = floor_align(committed, self.page_size)
        if is_insert:
            tokens = req.all_token_ids[:committed]
            new_prefix_len = self._insert_req(
                req, RadixKey(tokens[:aligned], req.extra_key), kv[:aligned], chunked=False
            )
            self._free_tree_slots(
                kv[req.cache_protected_len : new_prefix_len], req.cache_protected_len
            )
        else:
            free(kv[req.cache_protected_len : aligned])
        free(kv[aligned:committed])
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: list[int] | None = None
    ) -> None:
        """Between prefill chunks: insert ``fill_ids`` (page-aligned; hits by
        ``rules.hit_count``: a ``chunked`` insert counts none, or only past
        ``cache_inserted_len``), free the duplicates, re-match, rewrite
        ``row[cache_protected_len:len(new_indices)]`` with the tree's slots, move the lock to
        the new last node and set ``prefix_indices``/``cache_protected_len``. The row stays.
        ``rules.release_path == "checkpoint"``: the same through :meth:`checkpoint` (its
        duplicate free follows ``rules.tree_free``; the prompt re-insert never applies, a chunk
        being part of the prompt). ``row_read``: ``row[:len(fill_ids)]`` as the caller already
        read it, used instead of a read of the row (not under ``"checkpoint"``)."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        row = req.req_pool_idx
        tokens = list(req.fill_ids)
        if self.rules.release_path == "checkpoint" and not self.disable:
            req.prefix_indices = self.checkpoint(req, len(tokens), chunked)
            return
        if row_read is not None:
            kv = list(row_read[: len(tokens)])
        else:
            kv = self.req_to_token_pool.read(row, 0, len(tokens))
        if self.disable:
            req.prefix_indices = kv
            return
        aligned = floor_align(len(tokens), self.page_size)
        key = RadixKey(tokens[:aligned], req.extra_key)
        new_prefix_len = self._insert_req(req, key, kv[:aligned], chunked=chunked)
        self.token_to_kv_pool_allocator.free(kv[req.cache_protected_len : new_prefix_len])
        match = self.match_prefix(key)
        new_indices = match.device_indices
        protected = req.cache_protected_len
        self.req_to_token_pool.write(
            (row, slice(protected, len(new_indices))), new_indices[protected:]
        )
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.prefix_indices = new_indices + kv[len(new_indices) :]
        req.cache_protected_len = len(new_indices)
        req.last_node = match.last_device_node

    # ----------------------------------------------------------------- views


__all__ = ["RadixRelease"]

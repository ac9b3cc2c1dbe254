"""The release path of the radix cache: how a request's KV enters the tree and leaves its row.

``cache_finished_req`` (a request finishes), ``cache_unfinished_req`` (between prefill chunks)
and, under ``Rules.release_path == "checkpoint"``, SGLang 0.5.23's ``checkpoint``; the slots the
tree owned go back through ``Rules.tree_free``. A mixin of
:class:`~kvpool.optimized.radix.radix_cache.RadixCache` (which provides the tree, its pools and
``insert`` / ``match_prefix`` / the locks); mirrored in both twins.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvpool.constants import floor_align
from kvpool.errors import InvalidArgumentError
from kvpool.optimized.radix_key import (
    MatchResult,
    RadixKey,
    TreeNode,
    req_key,
)
from kvpool.optimized.req import Req
from kvpool.protocols import ReqToTokenPoolProtocol, SegmentAllocatorProtocol
from kvpool.rules import Rules

_EMPTY = torch.empty(0, dtype=torch.int64)


class RadixRelease:
    """The release-path methods of :class:`~kvpool.optimized.radix.radix_cache.RadixCache`."""

    page_size: int
    disable: bool
    rules: Rules
    req_to_token_pool: ReqToTokenPoolProtocol[torch.Tensor]
    token_to_kv_pool_allocator: SegmentAllocatorProtocol[torch.Tensor]
    insert: Callable[..., int]
    match_prefix: Callable[[RadixKey], MatchResult]
    inc_lock_ref: Callable[[TreeNode | None], int]
    dec_lock_ref: Callable[[TreeNode | None], int]
    _read_row: Callable[[int, int], torch.Tensor]

    def _free_tree_slots(self, slots: torch.Tensor, start_pos: int) -> None:
        """Return slots the tree owned (an evicted node's, a finished request's duplicates
        starting at column ``start_pos``) as ``rules.tree_free`` says: ``free`` or SGLang
        0.5.23's ``free_segment``."""
        if self.rules.tree_free == "segment":
            self.token_to_kv_pool_allocator.free_segment(slots, start_pos)
        else:
            self.token_to_kv_pool_allocator.free(slots)

    def _row_or_read(self, row: int, stop: int, row_read: torch.Tensor | None) -> torch.Tensor:
        """``row_read`` when the caller read ``row[:stop]`` already, else one read of it."""
        if row_read is not None:
            assert len(row_read) == stop, "row_read covers the columns released"
            return row_read
        return self._read_row(row, stop)

    def _insert_req(self, req: Req, key: RadixKey, value: torch.Tensor, chunked: bool) -> int:
        """Insert ``key`` for ``req``, counting hits as ``rules.hit_count`` says (``chunked``, or
        past ``req.cache_inserted_len``, which then rises to the key's length)."""
        if self.rules.hit_count == "chunked":
            return self.insert(key, value, priority=req.priority, chunked=chunked)
        done = self.insert(key, value, priority=req.priority, inserted_len=req.cache_inserted_len)
        req.cache_inserted_len = max(req.cache_inserted_len, len(key))
        return done

    def checkpoint(self, req: Req, up_to: int, chunked: bool = False) -> torch.Tensor:
        """SGLang 0.5.23's ``checkpoint`` (see the reference): insert, re-insert a shorter
        page-aligned prompt with ``priority + 1`` and no hit, free the duplicates, match again,
        rewrite the row, move ``cache_protected_len`` and the lock. Returns ``row[:up_to]``
        as it is afterwards (int64)."""
        assert req.req_pool_idx is not None
        row = req.req_pool_idx
        kv = self._read_row(row, up_to)
        aligned = floor_align(up_to, self.page_size)
        key = req_key(req, aligned)
        new_prefix_len = self._insert_req(req, key, kv[:aligned], chunked)
        prompt = floor_align(min(up_to, len(req.origin_input_ids)), self.page_size)
        if 0 < prompt < aligned:
            self.insert(
                req_key(req, prompt), kv[:prompt], priority=req.priority + 1, inserted_len=prompt
            )
        protected = req.cache_protected_len
        self._free_tree_slots(kv[protected:new_prefix_len], protected)
        match = self.match_prefix(key)
        new_indices = match.device_indices
        num_new = len(new_indices)
        self.req_to_token_pool.write((row, slice(protected, num_new)), new_indices[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = num_new
        req.last_node = match.last_device_node
        return torch.cat((new_indices, kv[num_new:]))

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: torch.Tensor | None = None
    ) -> None:
        """Hand a finished request's committed KV to the tree (or free it), then unlock its node.

        ``kv = row[:committed]``. ``rules.release_path == "finished_req"``: with insert, insert
        the page-aligned part, free the duplicates ``kv[cache_protected_len:new_prefix_len]``,
        then the unaligned tail ``kv[aligned:committed]`` (two frees, as the reference); without,
        free ``kv[cache_protected_len:aligned]``, then the tail; disabled, one free of
        ``kv[cache_protected_len:committed]``. ``"checkpoint"``: with insert, :meth:`checkpoint`
        up to ``committed``; then one ``free_segment`` of ``row[cache_protected_len:
        committed]``, disabled or not.

        ``row_read``: ``row[:committed]`` as the caller already read it (int64, 1-D, on the
        device: the lifecycle reads a finish batch's rows in one gather), used instead of a read
        of the row (under ``"checkpoint"`` only without insert: the checkpoint rewrites the
        row). The request's slots are then views of it: with the radix cache, the release of a
        request launches no tensor operation, and inside a free group its frees are buffered."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        committed = req.kv_committed_len
        if self.rules.release_path == "checkpoint":
            rewritten = is_insert and not self.disable
            if rewritten:
                self.checkpoint(req, committed)
            protected = req.cache_protected_len
            kv = self._row_or_read(req.req_pool_idx, committed, None if rewritten else row_read)
            self.token_to_kv_pool_allocator.free_segment(kv[protected:], protected)
            self.dec_lock_ref(req.last_node)
            return
        kv = self._row_or_read(req.req_pool_idx, committed, row_read)
        free = self.token_to_kv_pool_allocator.free
        if self.disable:
            free(kv[req.cache_protected_len : committed])
            return
        aligned = floor_align(committed, self.page_size)
        if is_insert:
            key = req_key(req, aligned)
            new_prefix_len = self._insert_req(req, key, kv[:aligned], chunked=False)
            self._free_tree_slots(
                kv[req.cache_protected_len : new_prefix_len], req.cache_protected_len
            )
        else:
            free(kv[req.cache_protected_len : aligned])
        free(kv[aligned:committed])
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: torch.Tensor | None = None
    ) -> None:
        """Between prefill chunks: insert ``fill_ids`` (page-aligned; hits by
        ``rules.hit_count``), free the duplicates, re-match, rewrite
        ``row[cache_protected_len:len(new_indices)]`` with the tree's slots, move the lock to
        the new last node and set ``prefix_indices``/``cache_protected_len``
        (``rules.release_path == "checkpoint"``: through :meth:`checkpoint`).

        ``row_read``: ``row[:len(fill_ids)]`` as the caller already read it (int64, 1-D, on the
        device), used instead of a read of the row (not under ``"checkpoint"``). When the tree
        held nothing of the chunk past ``cache_protected_len`` (no duplicates; the usual case)
        and the re-match covers the whole aligned chunk, the tree's slots past the protected
        prefix are this request's own: the row already holds them, so the reference's rewrite
        would change no slot and is skipped, and ``prefix_indices`` is ``kv`` itself (the same
        values as the reference's join): neither launches anything."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        row = req.req_pool_idx
        num_tokens = len(req.fill_ids)
        if self.rules.release_path == "checkpoint" and not self.disable:
            req.prefix_indices = self.checkpoint(req, num_tokens, chunked)
            return
        kv = self._row_or_read(row, num_tokens, row_read)
        if self.disable:
            req.prefix_indices = kv
            return
        aligned = floor_align(num_tokens, self.page_size)
        key = req_key(req, aligned)
        new_prefix_len = self._insert_req(req, key, kv[:aligned], chunked=chunked)
        self.token_to_kv_pool_allocator.free(kv[req.cache_protected_len : new_prefix_len])
        match = self.match_prefix(key)
        new_indices = match.device_indices
        protected = req.cache_protected_len
        num_new = len(new_indices)
        own = new_prefix_len == protected and num_new == aligned  # no rewrite changes a slot
        if not own:
            self.req_to_token_pool.write((row, slice(protected, num_new)), new_indices[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.prefix_indices = kv if own else torch.cat((new_indices, kv[num_new:]))
        req.cache_protected_len = num_new
        req.last_node = match.last_device_node

    # ------------------------------------------------------------------ views


__all__ = ["RadixRelease"]

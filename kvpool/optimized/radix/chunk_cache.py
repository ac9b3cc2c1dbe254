"""``ChunkCache`` (optimized twin): the radix cache disabled: no tree, no nodes, no sharing.

Mirrors :mod:`kvpool.reference.radix.chunk_cache`: every request owns all of its slots; matching
finds nothing, finishing frees ``row[cache_protected_len:kv_committed_len]`` and between prefill
chunks only ``req.prefix_indices`` is refreshed (an int64 tensor here). Locks are no-ops; sizes are
0.
"""

from __future__ import annotations

import torch

from kvpool.constants import EVICTION_POLICIES, floor_align
from kvpool.errors import ConfigError, InvalidArgumentError
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.options import TwinOptions, options_of
from kvpool.optimized.radix.checks import check_slots_held, tree_slots
from kvpool.optimized.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.optimized.req import Req
from kvpool.protocols.pools import ReqToTokenPoolProtocol, SegmentAllocatorProtocol
from kvpool.reference.radix.checks import (  # pure host checks, shared
    check_count,
    check_flag,
    check_insert_flags,
    check_key,
    check_release,
    check_row_read_len,
    fill_len,
)
from kvpool.reference.radix_key import tree_slot_limit
from kvpool.rules import Rules
from kvpool.snapshot import TreeSnapshot


class ChunkCache:
    """Same call shapes as :class:`~kvpool.optimized.radix.radix_cache.RadixCache` with ``disable``
    always True; ``match_prefix`` returns no slots and ``last_device_node=None``.
    ``options``: the twin's :class:`~kvpool.optimized.options.TwinOptions`; a tree built alone
    over collaborators and given none runs as its allocator does (:func:`~kvpool.optimized.options.
    options_of`)."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPoolProtocol[torch.Tensor],
        token_to_kv_pool_allocator: SegmentAllocatorProtocol[torch.Tensor],
        page_size: int,
        eviction_policy: str = "lru",
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
    ) -> None:
        if page_size != token_to_kv_pool_allocator.page_size:
            raise ConfigError(
                f"page_size {page_size} differs from the allocator's "
                f"{token_to_kv_pool_allocator.page_size}"
            )
        if eviction_policy not in EVICTION_POLICIES:
            raise ConfigError(f"unknown eviction_policy {eviction_policy!r}")
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.rules = rules if rules is not None else Rules()
        self.disable = True
        self.eviction_policy = eviction_policy
        self.options = options if options is not None else options_of(token_to_kv_pool_allocator)
        self.device = self.options.device

    def reset(self) -> None:
        """Nothing to forget."""

    def match_prefix(self, key: RadixKey) -> MatchResult:
        """Never matches (InvalidArgumentError unless ``key`` is a RadixKey)."""
        check_key(key, RadixKey)
        return MatchResult(torch.empty(0, dtype=torch.int64, device=self.device), None, None)

    def insert(
        self,
        key: RadixKey,
        value: torch.Tensor | None = None,
        priority: int = 0,
        chunked: bool = False,
        inserted_len: int | None = None,
    ) -> int:
        """Caches nothing; 0 tokens were already cached. The arguments are checked as the
        radix cache's ``insert`` checks them (as the reference)."""
        check_key(key, RadixKey)
        check_insert_flags(priority, chunked, inserted_len)
        if value is not None:
            limit = tree_slot_limit(self.token_to_kv_pool_allocator)
            slots = tree_slots(value, len(key), self.device, self.options.checked, limit)
            if self.options.checked:
                aligned = floor_align(len(key), self.page_size)
                check_slots_held(self.token_to_kv_pool_allocator, slots[:aligned])
        return 0

    @staticmethod
    def _check_no_node(node: object) -> None:
        """A chunk cache has no nodes: its requests hold ``last_node = None``."""
        if node is not None:
            raise InvalidArgumentError(
                f"a chunk cache has no nodes: node must be None, got {node!r}"
            )

    def inc_lock_ref(self, node: TreeNode | None) -> int:
        """No-op for ``None`` (InvalidArgumentError for anything else)."""
        self._check_no_node(node)
        return 0

    def dec_lock_ref(self, node: TreeNode | None) -> int:
        """No-op for ``None`` (InvalidArgumentError for anything else)."""
        self._check_no_node(node)
        return 0

    def evict(self, num_tokens: int) -> int:
        """Nothing is evictable (InvalidArgumentError unless ``num_tokens`` is a count)."""
        check_count("num_tokens", num_tokens)
        return 0

    def _check_row_read(self, row_read: object, stop: int) -> torch.Tensor | None:
        """A caller's row read: a 1-D integer index argument of ``stop`` columns."""
        if row_read is None:
            return None
        if (
            isinstance(row_read, torch.Tensor)
            and row_read.dtype is torch.int64
            and row_read.dim() == 1
        ):
            kv = row_read  # the lifecycle's batch read: taken as it is (a view, no launch)
        else:
            kv = index_tensor("row_read", row_read, self.device)
        check_row_read_len(kv.shape[0], stop)
        return kv

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: torch.Tensor | None = None
    ) -> None:
        """Free ``row[cache_protected_len:kv_committed_len]`` (``is_insert`` is ignored): one
        ``free``, or under ``rules.release_path == "checkpoint"`` one ``free_segment`` (SGLang
        0.5.23's ``free_kv_row``). ``row_read``: ``row[:kv_committed_len]`` as the caller
        already read it (int64, 1-D, on the device), used instead of a read of the row: the
        free is then of a view of it (no tensor operation; buffered inside a free group).
        Checked before any change as the reference."""
        check_flag("is_insert", is_insert)
        _, committed, _ = check_release(req, self.req_to_token_pool)
        row_read = self._check_row_read(row_read, committed)
        assert req.req_pool_idx is not None
        if row_read is not None:
            kv = row_read[: req.kv_committed_len]
        else:
            kv = self.req_to_token_pool.read(req.req_pool_idx, 0, req.kv_committed_len)
        own = kv[req.cache_protected_len :].to(torch.int64)
        if self.rules.release_path == "checkpoint":
            self.token_to_kv_pool_allocator.free_segment(own, req.cache_protected_len)
        else:
            self.token_to_kv_pool_allocator.free(own)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: torch.Tensor | None = None
    ) -> None:
        """``req.prefix_indices = row[:len(fill_ids)]`` (int64; ``row_read``, the caller's read
        of those columns, when given: then a view of it, no tensor operation); nothing else
        changes. Checked before any change as the reference."""
        check_flag("chunked", chunked)
        num_tokens = fill_len(req)
        check_release(req, self.req_to_token_pool, num_tokens)
        row_read = self._check_row_read(row_read, num_tokens)
        assert req.req_pool_idx is not None
        if row_read is not None:
            req.prefix_indices = row_read[: len(req.fill_ids)]
            return
        kv = self.req_to_token_pool.read(req.req_pool_idx, 0, len(req.fill_ids))
        req.prefix_indices = kv.to(torch.int64)

    def pretty_print(self) -> str:
        return f"(chunk cache: radix cache disabled, page_size={self.page_size})"

    def snapshot(self) -> TreeSnapshot:
        """A disabled tree: no nodes, zero sizes."""
        return TreeSnapshot(
            page_size=self.page_size,
            disabled=True,
            eviction_policy=self.eviction_policy,
            evictable_size=0,
            protected_size=0,
            nodes=(),
        )


__all__ = ["ChunkCache"]

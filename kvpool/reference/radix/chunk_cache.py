"""``ChunkCache``: the radix cache disabled (SGLang's ChunkCache): no tree, no nodes, no sharing.

Every request owns all of its slots: matching finds nothing, finishing frees
``row[cache_protected_len:kv_committed_len]`` (``cache_protected_len`` stays 0), and between
prefill chunks only ``req.prefix_indices`` is refreshed. Locks are no-ops; sizes are all 0.
"""

from __future__ import annotations

from kvpool.constants import EVICTION_POLICIES
from kvpool.errors import ConfigError, InvalidArgumentError
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.reference.req import Req
from kvpool.rules import Rules
from kvpool.snapshot import TreeSnapshot


class ChunkCache:
    """Same call shapes as :class:`~kvpool.reference.radix.radix_cache.RadixCache` with ``disable``
    always True; ``match_prefix`` returns no slots and ``last_device_node=None``."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: BaseTokenToKVPoolAllocator,
        page_size: int,
        eviction_policy: str = "lru",
        *,
        rules: Rules | None = None,
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

    def reset(self) -> None:
        """Nothing to forget."""

    def match_prefix(self, key: RadixKey) -> MatchResult:
        """Never matches."""
        return MatchResult([], None, None)

    def insert(
        self,
        key: RadixKey,
        value: list[int] | None = None,
        priority: int = 0,
        chunked: bool = False,
        inserted_len: int | None = None,
    ) -> int:
        """Caches nothing; 0 tokens were already cached."""
        return 0

    def inc_lock_ref(self, node: TreeNode | None) -> int:
        return 0

    def dec_lock_ref(self, node: TreeNode | None) -> int:
        return 0

    def evict(self, num_tokens: int) -> int:
        """Nothing is evictable."""
        if num_tokens < 0:
            raise InvalidArgumentError(f"num_tokens must be >= 0, got {num_tokens}")
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def cache_finished_req(
        self, req: Req, is_insert: bool = True, row_read: list[int] | None = None
    ) -> None:
        """Free ``row[cache_protected_len:kv_committed_len]`` (``is_insert`` is ignored): one
        ``free``, or under ``rules.release_path == "checkpoint"`` one ``free_segment`` (SGLang
        0.5.23's ``free_kv_row``). ``row_read``: ``row[:kv_committed_len]`` as the caller
        already read it, used instead of a read of the row."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        if row_read is not None:
            kv = list(row_read[: req.kv_committed_len])
        else:
            kv = self.req_to_token_pool.read(req.req_pool_idx, 0, req.kv_committed_len)
        own = kv[req.cache_protected_len :]
        if self.rules.release_path == "checkpoint":
            self.token_to_kv_pool_allocator.free_segment(own, req.cache_protected_len)
        else:
            self.token_to_kv_pool_allocator.free(own)

    def cache_unfinished_req(
        self, req: Req, chunked: bool = False, row_read: list[int] | None = None
    ) -> None:
        """``req.prefix_indices = row[:len(fill_ids)]`` (``row_read``, the caller's read of
        those columns, when given); nothing else changes."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        if row_read is not None:
            req.prefix_indices = list(row_read[: len(req.fill_ids)])
            return
        req.prefix_indices = self.req_to_token_pool.read(req.req_pool_idx, 0, len(req.fill_ids))

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

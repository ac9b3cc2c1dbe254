"""``ChunkCache``: the radix cache disabled (SGLang's ChunkCache): no tree, no nodes, no sharing.

Every request owns all of its slots: matching finds nothing, finishing frees
``row[cache_protected_len:kv_committed_len]`` (``cache_protected_len`` stays 0), and between
prefill chunks only ``req.prefix_indices`` is refreshed. Locks are no-ops; sizes are all 0.
"""

from __future__ import annotations

from kvpool.constants import EVICTION_POLICIES, floor_align
from kvpool.errors import ConfigError, InvalidArgumentError
from kvpool.host_checks import int_list
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix.checks import (
    check_count,
    check_distinct,
    check_flag,
    check_held,
    check_insert_flags,
    check_key,
    check_release,
    check_row_read_len,
    fill_len,
)
from kvpool.reference.radix_key import (
    MatchResult,
    RadixKey,
    TreeNode,
    check_tree_slots,
    tree_slot_limit,
)
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
        """Never matches (InvalidArgumentError unless ``key`` is a RadixKey)."""
        check_key(key, RadixKey)
        return MatchResult([], None, None)

    def insert(
        self,
        key: RadixKey,
        value: list[int] | None = None,
        priority: int = 0,
        chunked: bool = False,
        inserted_len: int | None = None,
    ) -> int:
        """Caches nothing; 0 tokens were already cached. The arguments are checked as
        :meth:`RadixCache.insert <kvpool.reference.radix.radix_cache.RadixCache.insert>` checks
        them (a caller bug is one whichever tree runs)."""
        check_key(key, RadixKey)
        check_insert_flags(priority, chunked, inserted_len)
        if value is not None:
            slots = int_list("value", value)
            if len(slots) < len(key):
                raise InvalidArgumentError(f"{len(slots)} slots for a key of {len(key)} tokens")
            slots = check_tree_slots(
                slots[: len(key)], tree_slot_limit(self.token_to_kv_pool_allocator)
            )
            check_distinct(slots)
            check_held(
                self.token_to_kv_pool_allocator, slots[: floor_align(len(key), self.page_size)]
            )
        return 0

    @staticmethod
    def _check_no_node(node: object) -> None:
        """A chunk cache has no nodes: its requests hold ``last_node = None`` (what
        :meth:`match_prefix` returns); anything else is a caller bug."""
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
        already read it, used instead of a read of the row. Checked before any change:
        ``is_insert`` a bool, the request
        (:func:`~kvpool.reference.radix.checks.check_release`) and ``row_read`` (integers, one
        per committed token)."""
        check_flag("is_insert", is_insert)
        _, committed, _ = check_release(req, self.req_to_token_pool)
        if row_read is not None:
            row_read = int_list("row_read", row_read)
            check_row_read_len(len(row_read), committed)
        assert req.req_pool_idx is not None
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
        those columns, when given); nothing else changes. Checked before any change:
        ``chunked`` a bool, the request up to ``len(fill_ids)`` and ``row_read``, as
        :meth:`cache_finished_req`."""
        check_flag("chunked", chunked)
        check_release(req, self.req_to_token_pool, fill_len(req))
        if row_read is not None:
            row_read = int_list("row_read", row_read)
            check_row_read_len(len(row_read), len(req.fill_ids))
        assert req.req_pool_idx is not None
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

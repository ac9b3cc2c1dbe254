"""``SWAChunkCache`` (optimized twin): the chunk cache of a hybrid sliding-window model.

Twin of :mod:`kvpool.reference.swa.chunk_cache`: a
:class:`~kvpool.optimized.radix.chunk_cache.ChunkCache` over an
:class:`~kvpool.optimized.swa.allocator.SWATokenToKVPoolAllocator`. A finished request frees
``row[cache_protected_len:kv_committed_len]`` through the SWA allocator's ``free``, which frees
the full slots and only the SWA slots still mapped: those the window released earlier
(``free_swa``) map to 0 and are not freed twice. Nothing is evictable, in either pool
(``evict`` is the chunk cache's: 0 tokens).
"""

from __future__ import annotations

from kvpool.errors import InvalidArgumentError
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.optimized.radix.chunk_cache import ChunkCache
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator


class SWAChunkCache(ChunkCache):
    """Chunk cache with a sliding window of ``sliding_window_size`` tokens (see the module
    docstring). InvalidArgumentError for a window below 1. ``options``: as
    :class:`~kvpool.optimized.radix.chunk_cache.ChunkCache`'s."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: SWATokenToKVPoolAllocator,
        page_size: int,
        sliding_window_size: int,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        if sliding_window_size < 1:
            raise InvalidArgumentError(f"sliding_window_size must be >= 1: {sliding_window_size}")
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size, options=options)  # type: ignore[arg-type]
        self.sliding_window_size = sliding_window_size


__all__ = ["SWAChunkCache"]

"""Sliding-window models: the SWA allocator and KV pool, the SWA radix tree and chunk cache, and
the scheduler's window steps (the twin). Each public class is imported here from the module that
defines it.
"""

from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.optimized.swa.chunk_cache import SWAChunkCache
from kvpool.optimized.swa.kv_pool import SWAKVPool
from kvpool.optimized.swa.pure_allocator import PureSWATokenToKVPoolAllocator
from kvpool.optimized.swa.radix_cache import SWAMatchResult, SWARadixCache
from kvpool.optimized.swa.tree_node import SWATreeNode

__all__ = [
    "PureSWATokenToKVPoolAllocator",
    "SWAChunkCache",
    "SWAKVPool",
    "SWAMatchResult",
    "SWARadixCache",
    "SWATokenToKVPoolAllocator",
    "SWATreeNode",
]

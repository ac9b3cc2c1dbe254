"""Sliding-window models: the SWA allocator and KV pool, the SWA radix tree and chunk cache, and
the scheduler's window steps (the reference). Each public class is imported here from the module
that defines it.
"""

from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.reference.swa.chunk_cache import SWAChunkCache
from kvpool.reference.swa.kv_pool import SWAKVPool
from kvpool.reference.swa.pure_allocator import PureSWATokenToKVPoolAllocator
from kvpool.reference.swa.radix_cache import SWAMatchResult, SWARadixCache
from kvpool.reference.swa.tree_node import SWATreeNode

__all__ = [
    "PureSWATokenToKVPoolAllocator",
    "SWAChunkCache",
    "SWAKVPool",
    "SWAMatchResult",
    "SWARadixCache",
    "SWATokenToKVPoolAllocator",
    "SWATreeNode",
]

"""The request table and the token-slot allocators (page size 1 and paged), with their batch
operations (the twin). Each public class is imported here from the module that defines it.
"""

from kvpool.optimized.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.optimized.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.optimized.pools.token_allocator import TokenToKVPoolAllocator

__all__ = [
    "BaseTokenToKVPoolAllocator",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "TokenToKVPoolAllocator",
]

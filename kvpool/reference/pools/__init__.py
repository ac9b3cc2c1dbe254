"""The request table and the token-slot allocators (page size 1 and paged), with their batch
operations (the reference). Each public class is imported here from the module that defines it.
"""

from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator

__all__ = [
    "BaseTokenToKVPoolAllocator",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "TokenToKVPoolAllocator",
]

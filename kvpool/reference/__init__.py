"""The executable specification, in pure Python (never imports torch).

Readable first, then correct; speed is not its job. Every index it returns is deterministic, so
the optimized twin can be compared with it exactly.
"""

from kvpool.reference.allocator import BaseTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvpool.reference.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.reference.req_to_token_pool import ReqToTokenPool

__all__ = [
    "BaseTokenToKVPoolAllocator",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "TokenToKVPoolAllocator",
]

# Radix cache, KV buffers and the request lifecycle (appended).
from kvpool.reference.chunk_cache import ChunkCache
from kvpool.reference.hybrid_req_to_token_pool import HybridReqToTokenPool  # hybrid (Mamba) models
from kvpool.reference.kv_cache import (
    KVCache,
    MHATokenToKVPool,
    MLATokenToKVPool,
)
from kvpool.reference.mamba_allocator import MambaSlotAllocator
from kvpool.reference.mamba_pool import MambaPool
from kvpool.reference.memory_manager import MemoryManager
from kvpool.reference.radix_cache import RadixCache, logical_clock
from kvpool.reference.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.reference.req import Req
from kvpool.reference.session import SessionSlot

__all__ += [
    "ChunkCache",
    "KVCache",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
    "MatchResult",
    "MemoryManager",
    "RadixCache",
    "RadixKey",
    "Req",
    "SessionSlot",
    "TreeNode",
    "logical_clock",
]
__all__ += ["HybridReqToTokenPool", "MambaPool", "MambaSlotAllocator"]

# The host tier (hierarchical cache).
from kvpool.reference.hiradix_cache import HiRadixCache  # noqa: E402
from kvpool.reference.memory_pool_host import (  # noqa: E402
    HostKVCache,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
)

__all__ += ["HiRadixCache", "HostKVCache", "MHATokenToKVPoolHost", "MLATokenToKVPoolHost"]

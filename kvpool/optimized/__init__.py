"""The optimized twin: the same components and public API as :mod:`kvpool.reference`, on torch
tensors on any device, built for the GPU (no host syncs on hot paths, vectorised work).
Mirrors the reference file by file. (Being built: see the optimized-twin issue.)
"""

# Pools and allocators (request table, slot allocators, KV buffers, checked-mode switch).
from kvpool.optimized.allocator import BaseTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvpool.optimized.checked import CHECKED_ENV_VAR, resolve_checked
from kvpool.optimized.kv_cache import KVCache, MHATokenToKVPool, MLATokenToKVPool
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.optimized.req_to_token_pool import ReqToTokenPool

__all__ = [
    "CHECKED_ENV_VAR",
    "BaseTokenToKVPoolAllocator",
    "KVCache",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "TokenToKVPoolAllocator",
    "TwinOptions",
    "resolve_checked",
]

# Radix cache and lifecycle (tree, chunk cache, requests, sessions, memory manager).
from kvpool.optimized.chunk_cache import ChunkCache
from kvpool.optimized.hybrid_req_to_token_pool import HybridReqToTokenPool  # hybrid (Mamba) models
from kvpool.optimized.mamba_allocator import MambaSlotAllocator
from kvpool.optimized.mamba_pool import MambaPool
from kvpool.optimized.memory_manager import MemoryManager
from kvpool.optimized.radix_cache import RadixCache
from kvpool.optimized.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.optimized.req import Req
from kvpool.optimized.session import SessionSlot

__all__ += [
    "ChunkCache",
    "MatchResult",
    "MemoryManager",
    "RadixCache",
    "RadixKey",
    "Req",
    "SessionSlot",
    "TreeNode",
]
__all__ += ["HybridReqToTokenPool", "MambaPool", "MambaSlotAllocator"]

# The host tier (hierarchical cache).
from kvpool.optimized.hiradix_cache import HiRadixCache  # noqa: E402
from kvpool.optimized.memory_pool_host import (  # noqa: E402
    HostKVCache,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
)

__all__ += ["HiRadixCache", "HostKVCache", "MHATokenToKVPoolHost", "MLATokenToKVPoolHost"]

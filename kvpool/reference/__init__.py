"""The executable specification, in pure Python (never imports torch).

Readable first, then correct; speed is not its job. Every index it returns is deterministic, so
the optimized twin can be compared with it exactly.

The specification is a small base (``req``: the request; ``radix_key``: the radix key, node and
match result) under one package per family: ``pools`` (request table, slot allocators), ``kv``
(KV buffers and storage variants), ``radix`` (prefix cache), ``swa`` (sliding window), ``mamba``
(hybrid Mamba), ``hicache`` (host tier), ``unified`` (SGLang 0.5.23's unified tree) and
``lifecycle`` (the memory manager). Every public class is importable from here.
"""

from kvpool.reference.hicache.cache_controller import (
    HiCacheAck,
    HiCacheController,
    PrefetchOperation,
)
from kvpool.reference.hicache.evict import HostEviction
from kvpool.reference.hicache.hiradix_cache import HiRadixCache
from kvpool.reference.hicache.memory_pool_host import (
    HostKVCache,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
)
from kvpool.reference.hicache.prefetch import StoragePrefetch
from kvpool.reference.hicache.tree_node import HiTreeNode
from kvpool.reference.hicache.unified_tier import UnifiedHostTier
from kvpool.reference.kv.fp4 import FP4Layer, MHATokenToKVPoolFP4
from kvpool.reference.kv.kv_cache import KVCache
from kvpool.reference.kv.layer_transfer import LayerDoneCounter, LayerLoadingEvent
from kvpool.reference.kv.mha import MHATokenToKVPool
from kvpool.reference.kv.mla import MLATokenToKVPool
from kvpool.reference.kv.mla_fp4 import MLATokenToKVPoolFP4
from kvpool.reference.kv.mxfp8 import MHATokenToKVPoolMXFP8, MXFP8Layer
from kvpool.reference.kv.noop import NoOpMHATokenToKVPool
from kvpool.reference.kv.page_major import PageMajorMHATokenToKVPool, PageMajorView
from kvpool.reference.lifecycle.mamba_hooks import MambaHooks
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.reference.lifecycle.primitives import LifecyclePrimitives
from kvpool.reference.lifecycle.session import SessionSlot
from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.reference.lifecycle.swa_radix_lifecycle import (
    SWARadixLifecycle,
    UnifiedSWARadixLifecycle,
)
from kvpool.reference.mamba.allocator import MambaSlotAllocator
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.reference.mamba.pool import MambaPool
from kvpool.reference.mamba.radix_cache import MambaMatchResult, MambaRadixCache
from kvpool.reference.mamba.radix_release import MambaLifecycleCache
from kvpool.reference.mamba.tree_node import LRUList, MambaTreeNode
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator
from kvpool.reference.radix.chunk_cache import ChunkCache
from kvpool.reference.radix.radix_cache import RadixCache, logical_clock
from kvpool.reference.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.reference.req import Req
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.reference.swa.chunk_cache import SWAChunkCache
from kvpool.reference.swa.kv_pool import SWAKVPool
from kvpool.reference.swa.pure_allocator import PureSWATokenToKVPoolAllocator
from kvpool.reference.swa.radix_cache import SWAMatchResult, SWARadixCache
from kvpool.reference.swa.tree_node import SWATreeNode
from kvpool.reference.unified.mamba_radix_cache import UnifiedMambaRadixCache
from kvpool.reference.unified.mamba_release import UnifiedMambaLifecycleCache
from kvpool.reference.unified.radix_cache import UnifiedRadixCache
from kvpool.reference.unified.swa_radix_cache import UnifiedSWARadixCache

__all__ = [
    "BaseTokenToKVPoolAllocator",
    "ChunkCache",
    "FP4Layer",
    "HiCacheAck",
    "HiCacheController",
    "HiRadixCache",
    "HiTreeNode",
    "HostEviction",
    "HostKVCache",
    "HybridReqToTokenPool",
    "KVCache",
    "LRUList",
    "LayerDoneCounter",
    "LayerLoadingEvent",
    "LifecyclePrimitives",
    "MHATokenToKVPool",
    "MHATokenToKVPoolFP4",
    "MHATokenToKVPoolHost",
    "MHATokenToKVPoolMXFP8",
    "MLATokenToKVPool",
    "MLATokenToKVPoolFP4",
    "MLATokenToKVPoolHost",
    "MXFP8Layer",
    "MambaHooks",
    "MambaLifecycleCache",
    "MambaMatchResult",
    "MambaPool",
    "MambaRadixCache",
    "MambaSlotAllocator",
    "MambaTreeNode",
    "MatchResult",
    "MemoryManager",
    "NoOpMHATokenToKVPool",
    "PageMajorMHATokenToKVPool",
    "PageMajorView",
    "PagedTokenToKVPoolAllocator",
    "PrefetchOperation",
    "PureSWATokenToKVPoolAllocator",
    "RadixCache",
    "RadixKey",
    "Req",
    "ReqToTokenPool",
    "SWAChunkCache",
    "SWAKVPool",
    "SWAMatchResult",
    "SWAMemoryManager",
    "SWARadixCache",
    "SWARadixLifecycle",
    "SWATokenToKVPoolAllocator",
    "SWATreeNode",
    "SessionSlot",
    "StoragePrefetch",
    "TokenToKVPoolAllocator",
    "TreeNode",
    "UnifiedHostTier",
    "UnifiedMambaLifecycleCache",
    "UnifiedMambaRadixCache",
    "UnifiedRadixCache",
    "UnifiedSWARadixCache",
    "UnifiedSWARadixLifecycle",
    "logical_clock",
]

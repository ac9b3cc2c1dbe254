"""The optimized twin: the same components and public API as :mod:`kvpool.reference`, on torch
tensors on any device, built for the GPU (no host syncs on hot paths, vectorised work).

It mirrors the reference wing by wing and file by file: the same family packages (``pools``,
``kv``, ``radix``, ``swa``, ``mamba``, ``hicache``, ``unified``, ``lifecycle``) over a base of
``req``, ``radix_key``, ``key_match`` (token-key helpers), ``options`` (``TwinOptions``) and
``checked`` (the checked-mode switch). Every public class is importable from here.
"""

from kvpool.optimized.checked import CHECKED_ENV_VAR, resolve_checked
from kvpool.optimized.hicache.cache_controller import (
    HiCacheAck,
    HiCacheController,
    PrefetchOperation,
)
from kvpool.optimized.hicache.evict import HostEviction
from kvpool.optimized.hicache.hiradix_cache import HiRadixCache
from kvpool.optimized.hicache.memory_pool_host import (
    HostKVCache,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
)
from kvpool.optimized.hicache.prefetch import StoragePrefetch
from kvpool.optimized.hicache.tree_node import HiTreeNode
from kvpool.optimized.hicache.unified_tier import UnifiedHostTier
from kvpool.optimized.kv.fp4 import MHATokenToKVPoolFP4
from kvpool.optimized.kv.kv_cache import KVCache
from kvpool.optimized.kv.layer_transfer import LayerDoneCounter, LayerLoadingEvent
from kvpool.optimized.kv.mha import MHATokenToKVPool
from kvpool.optimized.kv.mla import MLATokenToKVPool
from kvpool.optimized.kv.mla_fp4 import MLATokenToKVPoolFP4
from kvpool.optimized.kv.mxfp8 import MHATokenToKVPoolMXFP8
from kvpool.optimized.kv.noop import NoOpMHATokenToKVPool
from kvpool.optimized.kv.page_major import PageMajorMHATokenToKVPool
from kvpool.optimized.lifecycle.mamba_hooks import MambaHooks
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.optimized.lifecycle.primitives import LifecyclePrimitives
from kvpool.optimized.lifecycle.session import SessionSlot
from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.optimized.lifecycle.swa_radix_lifecycle import (
    SWARadixLifecycle,
    UnifiedSWARadixLifecycle,
)
from kvpool.optimized.mamba.allocator import MambaSlotAllocator
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.optimized.mamba.pool import MambaPool
from kvpool.optimized.mamba.radix_cache import MambaMatchResult, MambaRadixCache
from kvpool.optimized.mamba.radix_release import MambaLifecycleCache
from kvpool.optimized.mamba.tree_node import LRUList, MambaTreeNode
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.optimized.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.optimized.pools.token_allocator import TokenToKVPoolAllocator
from kvpool.optimized.radix.chunk_cache import ChunkCache
from kvpool.optimized.radix.radix_cache import RadixCache
from kvpool.optimized.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.optimized.req import Req
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.optimized.swa.chunk_cache import SWAChunkCache
from kvpool.optimized.swa.kv_pool import SWAKVPool
from kvpool.optimized.swa.pure_allocator import PureSWATokenToKVPoolAllocator
from kvpool.optimized.swa.radix_cache import SWAMatchResult, SWARadixCache
from kvpool.optimized.swa.tree_node import SWATreeNode
from kvpool.optimized.unified.mamba_radix_cache import UnifiedMambaRadixCache
from kvpool.optimized.unified.mamba_release import UnifiedMambaLifecycleCache
from kvpool.optimized.unified.radix_cache import UnifiedRadixCache
from kvpool.optimized.unified.swa_radix_cache import UnifiedSWARadixCache

__all__ = [
    "CHECKED_ENV_VAR",
    "BaseTokenToKVPoolAllocator",
    "ChunkCache",
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
    "TwinOptions",
    "UnifiedHostTier",
    "UnifiedMambaLifecycleCache",
    "UnifiedMambaRadixCache",
    "UnifiedRadixCache",
    "UnifiedSWARadixCache",
    "UnifiedSWARadixLifecycle",
    "resolve_checked",
]

"""The host tier: the host KV pool, the controller of device/host transfers, and the hierarchical
radix tree (write policies, host eviction, prefetch, SGLang 0.5.23's unified host tier) (the
twin). Each public class is imported here from the module that defines it.
"""

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

__all__ = [
    "HiCacheAck",
    "HiCacheController",
    "HiRadixCache",
    "HiTreeNode",
    "HostEviction",
    "HostKVCache",
    "MHATokenToKVPoolHost",
    "MLATokenToKVPoolHost",
    "PrefetchOperation",
    "StoragePrefetch",
    "UnifiedHostTier",
]

"""The host tier: the host KV pool, the controller of device/host transfers, and the hierarchical
radix tree (write policies, host eviction, prefetch, SGLang 0.5.23's unified host tier) (the
reference). Each public class is imported here from the module that defines it.
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

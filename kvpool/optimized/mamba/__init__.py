"""Hybrid Mamba models: the state-slot allocator and pool, the hybrid request table, the Mamba
radix tree and its release, and the scheduler's Mamba steps (the twin). Each public class is
imported here from the module that defines it.
"""

from kvpool.optimized.mamba.allocator import MambaSlotAllocator
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.optimized.mamba.pool import MambaPool
from kvpool.optimized.mamba.radix_cache import MambaMatchResult, MambaRadixCache
from kvpool.optimized.mamba.radix_release import MambaLifecycleCache
from kvpool.optimized.mamba.tree_node import LRUList, MambaTreeNode

__all__ = [
    "HybridReqToTokenPool",
    "LRUList",
    "MambaLifecycleCache",
    "MambaMatchResult",
    "MambaPool",
    "MambaRadixCache",
    "MambaSlotAllocator",
    "MambaTreeNode",
]

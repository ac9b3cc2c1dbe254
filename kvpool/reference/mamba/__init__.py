"""Hybrid Mamba models: the state-slot allocator and pool, the hybrid request table, the Mamba
radix tree and its release, and the scheduler's Mamba steps (the reference). Each public class
is imported here from the module that defines it.
"""

from kvpool.reference.mamba.allocator import MambaSlotAllocator
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.reference.mamba.pool import MambaPool
from kvpool.reference.mamba.radix_cache import MambaMatchResult, MambaRadixCache
from kvpool.reference.mamba.radix_release import MambaLifecycleCache
from kvpool.reference.mamba.tree_node import LRUList, MambaTreeNode

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

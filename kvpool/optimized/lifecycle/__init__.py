"""The request lifecycle: the memory manager and its primitives, speculative decoding, sessions,
the pool snapshot, and each family's part in the lifecycle (SWA manager, Mamba hooks, host tier)
(the twin). Each public class is imported here from the module that defines it.
"""

from kvpool.optimized.lifecycle.mamba_hooks import MambaHooks
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.optimized.lifecycle.primitives import LifecyclePrimitives
from kvpool.optimized.lifecycle.session import SessionSlot
from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.optimized.lifecycle.swa_radix_lifecycle import (
    SWARadixLifecycle,
    UnifiedSWARadixLifecycle,
)

__all__ = [
    "LifecyclePrimitives",
    "MambaHooks",
    "MemoryManager",
    "SWAMemoryManager",
    "SWARadixLifecycle",
    "SessionSlot",
    "UnifiedSWARadixLifecycle",
]

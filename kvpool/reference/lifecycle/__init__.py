"""The request lifecycle: the memory manager and its primitives, speculative decoding, sessions,
the pool snapshot, and each family's part in the lifecycle (SWA manager, Mamba hooks, host tier)
(the reference). Each public class is imported here from the module that defines it.
"""

from kvpool.reference.lifecycle.mamba_hooks import MambaHooks
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.reference.lifecycle.primitives import LifecyclePrimitives
from kvpool.reference.lifecycle.session import SessionSlot
from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.reference.lifecycle.swa_radix_lifecycle import (
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

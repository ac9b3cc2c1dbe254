"""SGLang 0.5.23's unified radix cache: the FULL, FULL+SWA and FULL+MAMBA trees, and the FULL+MAMBA
tree in the lifecycle (the twin). Each public class is imported here from the module that
defines it.
"""

from kvpool.optimized.unified.mamba_radix_cache import UnifiedMambaRadixCache
from kvpool.optimized.unified.mamba_release import UnifiedMambaLifecycleCache
from kvpool.optimized.unified.radix_cache import UnifiedRadixCache
from kvpool.optimized.unified.swa_radix_cache import UnifiedSWARadixCache

__all__ = [
    "UnifiedMambaLifecycleCache",
    "UnifiedMambaRadixCache",
    "UnifiedRadixCache",
    "UnifiedSWARadixCache",
]

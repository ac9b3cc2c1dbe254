"""SGLang 0.5.23's unified radix cache: the FULL, FULL+SWA and FULL+MAMBA trees, and the FULL+MAMBA
tree in the lifecycle (the reference). Each public class is imported here from the module that
defines it.
"""

from kvpool.reference.unified.mamba_radix_cache import UnifiedMambaRadixCache
from kvpool.reference.unified.mamba_release import UnifiedMambaLifecycleCache
from kvpool.reference.unified.radix_cache import UnifiedRadixCache
from kvpool.reference.unified.swa_radix_cache import UnifiedSWARadixCache

__all__ = [
    "UnifiedMambaLifecycleCache",
    "UnifiedMambaRadixCache",
    "UnifiedRadixCache",
    "UnifiedSWARadixCache",
]

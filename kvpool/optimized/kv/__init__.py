"""The device KV buffers: the MHA and MLA pools, their storage variants (FP4, MXFP8, page-major,
no-op) and layer-wise loading (the twin). Each public class is imported here from the module
that defines it.
"""

from kvpool.optimized.kv.fp4 import MHATokenToKVPoolFP4
from kvpool.optimized.kv.kv_cache import KVCache
from kvpool.optimized.kv.layer_transfer import LayerDoneCounter, LayerLoadingEvent
from kvpool.optimized.kv.mha import MHATokenToKVPool
from kvpool.optimized.kv.mla import MLATokenToKVPool
from kvpool.optimized.kv.mla_fp4 import MLATokenToKVPoolFP4
from kvpool.optimized.kv.mxfp8 import MHATokenToKVPoolMXFP8
from kvpool.optimized.kv.noop import NoOpMHATokenToKVPool
from kvpool.optimized.kv.page_major import PageMajorMHATokenToKVPool

__all__ = [
    "KVCache",
    "LayerDoneCounter",
    "LayerLoadingEvent",
    "MHATokenToKVPool",
    "MHATokenToKVPoolFP4",
    "MHATokenToKVPoolMXFP8",
    "MLATokenToKVPool",
    "MLATokenToKVPoolFP4",
    "NoOpMHATokenToKVPool",
    "PageMajorMHATokenToKVPool",
]

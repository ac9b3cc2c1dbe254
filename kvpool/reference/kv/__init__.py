"""The device KV buffers: the MHA and MLA pools, their storage variants (FP4, MXFP8, page-major,
no-op) and layer-wise loading (the reference). Each public class is imported here from the
module that defines it.
"""

from kvpool.reference.kv.fp4 import FP4Layer, MHATokenToKVPoolFP4
from kvpool.reference.kv.kv_cache import KVCache
from kvpool.reference.kv.layer_transfer import LayerDoneCounter, LayerLoadingEvent
from kvpool.reference.kv.mha import MHATokenToKVPool
from kvpool.reference.kv.mla import MLATokenToKVPool
from kvpool.reference.kv.mla_fp4 import MLATokenToKVPoolFP4
from kvpool.reference.kv.mxfp8 import MHATokenToKVPoolMXFP8, MXFP8Layer
from kvpool.reference.kv.noop import NoOpMHATokenToKVPool
from kvpool.reference.kv.page_major import PageMajorMHATokenToKVPool, PageMajorView

__all__ = [
    "FP4Layer",
    "KVCache",
    "LayerDoneCounter",
    "LayerLoadingEvent",
    "MHATokenToKVPool",
    "MHATokenToKVPoolFP4",
    "MHATokenToKVPoolMXFP8",
    "MLATokenToKVPool",
    "MLATokenToKVPoolFP4",
    "MXFP8Layer",
    "NoOpMHATokenToKVPool",
    "PageMajorMHATokenToKVPool",
    "PageMajorView",
]

"""The KV pool a :class:`~kvpool.config.PoolConfig` names by ``kv_storage`` (all float32 logical
values; the pool classes are SGLang's names): ``fp4`` -> ``MHATokenToKVPoolFP4`` or
``MLATokenToKVPoolFP4``, ``mxfp8`` -> ``MHATokenToKVPoolMXFP8``, ``page_major`` ->
``PageMajorMHATokenToKVPool``, ``noop`` -> ``NoOpMHATokenToKVPool``. ``plain`` is
:func:`kvpool.reference.kv.kv_cache.kv_cache_from_config`'s own MHA / MLA pool.
"""

from __future__ import annotations

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.reference.kv.fp4 import MHATokenToKVPoolFP4
from kvpool.reference.kv.kv_cache import KVCache
from kvpool.reference.kv.mla_fp4 import MLATokenToKVPoolFP4
from kvpool.reference.kv.mxfp8 import MHATokenToKVPoolMXFP8
from kvpool.reference.kv.noop import NoOpMHATokenToKVPool
from kvpool.reference.kv.page_major import PageMajorMHATokenToKVPool

MHA_VARIANTS = {
    "fp4": MHATokenToKVPoolFP4,
    "mxfp8": MHATokenToKVPoolMXFP8,
    "page_major": PageMajorMHATokenToKVPool,
    "noop": NoOpMHATokenToKVPool,
}


def storage_variant_from_config(config: PoolConfig) -> KVCache:
    """The variant pool for ``config.kv_storage`` (not ``plain``)."""
    c = config
    if c.kv_layout == "mla":
        if c.kv_storage != "fp4":
            raise ConfigError(f"kv_storage {c.kv_storage!r} has no MLA pool")
        return MLATokenToKVPoolFP4(c.size, c.page_size, c.kv_lora_rank, c.qk_rope_head_dim,
                                   c.num_layers, c.start_layer)  # fmt: skip
    cls = MHA_VARIANTS[c.kv_storage]
    return cls(c.size, c.page_size, "float32", c.head_num, c.head_dim, c.num_layers,
               c.start_layer, c.v_head_dim)  # fmt: skip


__all__ = ["MHA_VARIANTS", "storage_variant_from_config"]

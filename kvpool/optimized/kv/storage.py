"""The KV pool a :class:`~kvpool.config.PoolConfig` names by ``kv_storage`` (torch twin of
:mod:`kvpool.reference.kv.storage`)."""

from __future__ import annotations

import torch

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.optimized.kv.fp4 import MHATokenToKVPoolFP4
from kvpool.optimized.kv.kv_cache import KVCache
from kvpool.optimized.kv.mha import MHATokenToKVPool
from kvpool.optimized.kv.mla import MLATokenToKVPool
from kvpool.optimized.kv.mla_fp4 import MLATokenToKVPoolFP4
from kvpool.optimized.kv.mxfp8 import MHATokenToKVPoolMXFP8
from kvpool.optimized.kv.noop import NoOpMHATokenToKVPool
from kvpool.optimized.kv.page_major import PageMajorMHATokenToKVPool
from kvpool.optimized.options import TwinOptions, twin_options

MHA_VARIANTS = {
    "fp4": MHATokenToKVPoolFP4,
    "mxfp8": MHATokenToKVPoolMXFP8,
    "page_major": PageMajorMHATokenToKVPool,
    "noop": NoOpMHATokenToKVPool,
}


def storage_variant_from_config(config: PoolConfig, options: TwinOptions | None = None) -> KVCache:
    """The variant pool for ``config.kv_storage`` (not ``plain``)."""
    c = config
    if c.kv_layout == "mla":
        if c.kv_storage != "fp4":
            raise ConfigError(f"kv_storage {c.kv_storage!r} has no MLA pool")
        return MLATokenToKVPoolFP4(c.size, c.page_size, c.kv_lora_rank, c.qk_rope_head_dim,
                                   c.num_layers, c.start_layer, options=options)  # fmt: skip
    cls = MHA_VARIANTS[c.kv_storage]
    return cls(c.size, c.page_size, torch.float32, c.head_num, c.head_dim, c.num_layers,
               c.start_layer, c.v_head_dim, options=options)  # fmt: skip


def kv_cache_from_config(config: PoolConfig, options: TwinOptions | None = None) -> KVCache:
    """The float32 MHA or MLA buffers a :class:`~kvpool.config.PoolConfig` describes, or the
    storage variant its ``kv_storage`` names (:func:`storage_variant_from_config`)."""
    options = twin_options(options)
    if config.kv_storage != "plain":
        return storage_variant_from_config(config, options)
    if config.kv_layout == "mha":
        return MHATokenToKVPool(
            config.size,
            config.page_size,
            torch.float32,
            config.head_num,
            config.head_dim,
            config.num_layers,
            config.start_layer,
            config.v_head_dim,
            options=options,
        )
    return MLATokenToKVPool(
        config.size,
        config.page_size,
        config.kv_lora_rank,
        config.qk_rope_head_dim,
        config.num_layers,
        config.start_layer,
        torch.float32,
        options=options,
    )


__all__ = ["MHA_VARIANTS", "kv_cache_from_config", "storage_variant_from_config"]

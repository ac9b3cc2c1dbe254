"""``implementation(source)``: SGLang's own components as a kvpool
:class:`~kvpool.testing.bundle.Implementation`, for the component lockstep machines."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.sglang.allocators import SGLangAllocator
from kvpool.sglang.loader import load_sglang
from kvpool.sglang.radix import SGLangRadixCache, make_radix_key
from kvpool.sglang.req_to_token import SGLangReqToTokenPool
from kvpool.sglang.swa import SGLangSWAAllocator
from kvpool.sglang.swa_radix import SGLangSWARadixCache
from kvpool.testing.bundle import Implementation


def implementation(
    source: str = "0.5.16",
    *,
    naive_extend: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Implementation:
    """SGLang from ``source`` (see :func:`kvpool.sglang.load_sglang`) with factories for the
    allocator, ``ReqToTokenPool``, ``RadixCache``, ``SWATokenToKVPoolAllocator`` and
    ``SWARadixCache`` (the last two for releases with 0.5.16's SWA classes, before 0.5.18;
    no ``manager``) and
    ``rules=Rules.for_sglang(version)``, the version read from the source. ``naive_extend``
    routes ``alloc_extend`` through SGLang's ``alloc_extend_naive`` (see
    :class:`~kvpool.sglang.allocators.SGLangAllocator`). Raises
    :class:`~kvpool.errors.SGLangLoadError` when the source cannot be loaded and
    :class:`~kvpool.errors.ConfigError` when kvpool has no rules preset for its version."""
    modules = load_sglang(source, cache_dir=cache_dir)
    rules = Rules.for_sglang(modules.version)
    # the SWA adapters follow 0.5.16's SWA classes; 0.5.23 rebuilt them over per-pool
    # components the loader does not load (its SWA factories stay absent: verify says so)
    swa_audited = rules.swa_free_resolve == "group_end"

    def allocator(config: PoolConfig) -> SGLangAllocator:
        return SGLangAllocator(
            modules, config.size, config.page_size, config.need_sort, naive_extend=naive_extend
        )

    def req_to_token_pool(config: PoolConfig) -> SGLangReqToTokenPool:
        return SGLangReqToTokenPool(modules, config.req_pool_size, config.max_context_len)

    def radix_cache(config: PoolConfig, pool: Any, alloc: Any) -> SGLangRadixCache:
        return SGLangRadixCache(
            modules,
            pool,
            alloc,
            config.page_size,
            disable=config.disable_radix_cache,
            eviction_policy=config.eviction_policy,
        )

    def swa_allocator(config: PoolConfig) -> SGLangSWAAllocator:
        return SGLangSWAAllocator(
            modules, config.size, config.swa_size, config.page_size, config.need_sort
        )

    def swa_radix_cache(config: PoolConfig, alloc: Any) -> SGLangSWARadixCache:
        return SGLangSWARadixCache(modules, alloc, config.page_size, config.sliding_window or 1)

    def radix_key(token_ids: Sequence[int], extra_key: str | None) -> Any:
        return make_radix_key(modules, token_ids, extra_key)

    def index(values: Sequence[int]) -> Any:
        import torch

        return torch.tensor(list(values), dtype=torch.int64)

    return Implementation(
        label=f"sglang-{modules.version}{'-naive-extend' if naive_extend else ''}",
        allocator=allocator,
        req_to_token_pool=req_to_token_pool,
        radix_cache=radix_cache,
        radix_key=radix_key,
        swa_allocator=swa_allocator if swa_audited else None,
        swa_radix_cache=swa_radix_cache if swa_audited else None,
        rules=rules,
        index=index,
    )


__all__ = ["implementation"]

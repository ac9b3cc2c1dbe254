"""``implementation(source)``: SGLang's own components as a kvpool
:class:`~kvpool.testing.bundle.Implementation`, for the component lockstep machines."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from kvpool.config import PoolConfig
from kvpool.reference.mamba import lifecycle as mamba_lifecycle
from kvpool.rules import Rules
from kvpool.sglang.allocators import SGLangAllocator
from kvpool.sglang.debug_pool import debug_asserts
from kvpool.sglang.hybrid import (
    HYBRID_RELEASES,
    MAMBA_RADIX_RELEASES,
    SGLangHybridReqToTokenPool,
)
from kvpool.sglang.loader import load_sglang
from kvpool.sglang.mamba_radix import SGLangMambaRadixCache
from kvpool.sglang.radix import SGLangRadixCache, make_radix_key
from kvpool.sglang.req_to_token import SGLangReqToTokenPool
from kvpool.sglang.swa import SGLangSWAAllocator
from kvpool.sglang.swa_radix import SGLangSWARadixCache
from kvpool.sglang.tree_core import has_unified_cache
from kvpool.sglang.unified16_base import has_unified16_cache
from kvpool.sglang.unified_radix import SGLangUnifiedRadixCache
from kvpool.testing.bundle import Implementation

SPEC_OPTIONS = (
    "naive",
    "rust-core",
    "python-core",
    "legacy-tree",
    "kvpool-lifecycle",
    "no-scheduler-checks",
    "no-debug-memory-pool",
)
"""Options a spec ``sglang:SOURCE+OPTION+...`` may end with (see :func:`from_spec`)."""


def from_spec(source: str) -> Implementation:
    """The implementation of ``sglang:SOURCE[+OPTION...]``'s part after the colon: ``+naive``
    (SGLang's naive extend), ``+python-core`` / ``+rust-core`` (the unified cache's tree core;
    Rust by default, as SGLang's), ``+legacy-tree`` (the lifecycle uses the legacy
    ``RadixCache`` instead of the unified cache), ``+kvpool-lifecycle`` (the lifecycle's memory
    steps are kvpool's own over SGLang's components, instead of SGLang's scheduler glue:
    :mod:`kvpool.sglang.glue_manager`), ``+no-scheduler-checks`` (the glue managers leave out
    SGLang's own scheduler checks: :mod:`kvpool.sglang.scheduler_checker`),
    ``+no-debug-memory-pool`` (SGLang's paged allocators are built without their debug asserts:
    :mod:`kvpool.sglang.debug_pool`). ValueError for two tree cores."""
    options: set[str] = set()
    while "+" in source and source.rpartition("+")[2] in SPEC_OPTIONS:
        source, _, option = source.rpartition("+")
        options.add(option)
    if {"rust-core", "python-core"} <= options:
        raise ValueError("give one tree core: +rust-core or +python-core")
    return implementation(
        source or "0.5.16",
        naive_extend="naive" in options,
        tree_core="python" if "python-core" in options else "rust",
        unified_lifecycle="legacy-tree" not in options,
        glue="kvpool-lifecycle" not in options,
        scheduler_checks="no-scheduler-checks" not in options,
        debug_memory_pool="no-debug-memory-pool" not in options,
    )


def implementation(
    source: str = "0.5.16",
    *,
    naive_extend: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    tree_core: str = "rust",
    unified_lifecycle: bool = True,
    glue: bool = True,
    scheduler_checks: bool = True,
    debug_memory_pool: bool = True,
) -> Implementation:
    """SGLang from ``source`` (see :func:`kvpool.sglang.load_sglang`) with factories for the
    allocator, ``ReqToTokenPool``, ``RadixCache`` and, for the audited releases
    (:data:`~kvpool.sglang.hybrid.HYBRID_RELEASES`), the hybrid pool, its Mamba steps and
    ``MambaRadixCache``, ``SWATokenToKVPoolAllocator`` and ``SWARadixCache`` (the last two for
    releases with 0.5.16's SWA classes, before 0.5.18; no ``manager``) and
    ``rules=Rules.for_sglang(version)``, the version read from the source. ``naive_extend``
    routes ``alloc_extend`` through SGLang's ``alloc_extend_naive`` (see
    :class:`~kvpool.sglang.allocators.SGLangAllocator`). Raises
    :class:`~kvpool.errors.SGLangLoadError` when the source cannot be loaded and
    :class:`~kvpool.errors.ConfigError` when kvpool has no rules preset for its version.

    A release with the unified radix cache (0.5.23) also gets ``unified_radix_cache``: SGLang's
    ``UnifiedRadixCache`` (FULL) over ``tree_core`` (``"rust"``, SGLang's default, or
    ``"python"``), which the lifecycle then uses as its tree, as SGLang's server does, unless
    ``unified_lifecycle`` is False (the legacy ``RadixCache`` then), and, with ``glue``, a
    ``manager``: kvpool's lifecycle whose memory steps are SGLang's own scheduler glue
    (:class:`~kvpool.sglang.glue_manager.SGLangGlueManager`), running SGLang's own scheduler
    checks at every step unless ``scheduler_checks`` is False.

    With ``debug_memory_pool`` the managers (``manager``, ``swa_manager``) build SGLang's paged
    allocators as a server with ``SGLANG_DEBUG_MEMORY_POOL=1`` does: SGLang then checks its
    own allocator contracts inside each call its scheduler glue makes
    (:mod:`kvpool.sglang.debug_pool`)."""
    modules = load_sglang(source, cache_dir=cache_dir)
    rules = Rules.for_sglang(modules.version)
    # the SWA tree adapter follows 0.5.16's SWARadixCache (0.5.23 has none: its SWA tree is the
    # unified cache's FULL+SWA set, ``unified_swa_radix_cache``); the SWA allocator adapter takes
    # both releases' SWATokenToKVPoolAllocator
    swa_audited = rules.swa_free_resolve == "group_end"
    swa_alloc_audited = swa_audited or has_unified_cache(modules)

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
            is_eagle=config.is_eagle,
        )

    def swa_allocator(config: PoolConfig) -> SGLangSWAAllocator:
        return SGLangSWAAllocator(modules, config.size, config.swa_size, config.page_size,
                                  config.need_sort, naive_extend=naive_extend)  # fmt: skip

    def swa_radix_cache(config: PoolConfig, alloc: Any) -> SGLangSWARadixCache:
        return SGLangSWARadixCache(modules, alloc, config.page_size, config.sliding_window or 1,
                                   is_eagle=config.is_eagle)  # fmt: skip

    def radix_key(token_ids: Sequence[int], extra_key: str | None) -> Any:
        return make_radix_key(modules, token_ids, extra_key)

    def hybrid(config: PoolConfig) -> SGLangHybridReqToTokenPool:
        slots = config.mamba_slots if config.mamba_slots is not None else config.req_pool_size
        return SGLangHybridReqToTokenPool(modules, config.req_pool_size, config.max_context_len,
                                          slots, config.mamba_layers,
                                          config.mamba_track_buffers)  # fmt: skip

    def mamba_tree(config: PoolConfig, pool: Any, alloc: Any) -> SGLangMambaRadixCache:
        return SGLangMambaRadixCache(modules, pool, alloc, config.page_size)

    has_hybrid = modules.version in HYBRID_RELEASES

    def index(values: Sequence[int]) -> Any:
        import torch

        return torch.tensor(list(values), dtype=torch.int64)

    def hiradix_cache(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        from kvpool.optimized.kv.storage import kv_cache_from_config
        from kvpool.sglang.hiradix import SGLangHiRadixCache

        return SGLangHiRadixCache(modules, pool, alloc, config.page_size,
                                  kv_cache_from_config(config), config.hicache_ratio,
                                  config.eviction_policy, config.hicache_write_policy,
                                  config.hicache_load_back_threshold,
                                  config.hicache_prefetch_threshold,
                                  config.hicache_storage, is_eagle=config.is_eagle)  # fmt: skip

    def unified_hiradix_cache(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        """0.5.23's host tier: the unified cache with ``init_hicache``'s host tier attached
        (kvpool.sglang.unified_hicache), for the ``hiradix_cache`` machine only."""
        from kvpool.optimized.kv.storage import kv_cache_from_config
        from kvpool.sglang.unified_hicache import SGLangUnifiedHiCache

        return SGLangUnifiedHiCache(modules, pool, alloc, config.page_size,
                                    kv_cache_from_config(config), config.hicache_ratio,
                                    config.eviction_policy, config.hicache_write_policy,
                                    config.hicache_load_back_threshold, tree_core,
                                    config.hicache_prefetch_threshold,
                                    config.hicache_storage,
                                    is_eagle=config.is_eagle)  # fmt: skip

    unified_hicache = unified_hiradix_cache if has_unified_cache(modules) else None
    unified = None
    if has_unified_cache(modules):

        def unified(config: PoolConfig, pool: Any, alloc: Any) -> SGLangUnifiedRadixCache:
            return SGLangUnifiedRadixCache(modules, pool, alloc, config.page_size,
                                           disable=config.disable_radix_cache,
                                           eviction_policy=config.eviction_policy,
                                           tree_core=tree_core,
                                           is_eagle=config.is_eagle)  # fmt: skip

    unified_swa = None
    if has_unified_cache(modules):

        def unified_swa(config: PoolConfig, alloc: Any) -> Any:
            from kvpool.sglang.unified_swa_radix import SGLangUnifiedSWARadixCache

            return SGLangUnifiedSWARadixCache(modules, alloc, config.page_size,
                                              config.sliding_window or 1,
                                              eviction_policy=config.eviction_policy,
                                              tree_core=tree_core,
                                              is_eagle=config.is_eagle)  # fmt: skip

    if unified_swa is None and has_unified16_cache(modules):

        def unified_swa(config: PoolConfig, alloc: Any) -> Any:
            """0.5.16's FULL+SWA ``UnifiedRadixCache`` (kvpool.sglang.unified16_swa_radix)."""
            from kvpool.sglang.unified16_swa_radix import SGLangUnified16SWARadixCache

            return SGLangUnified16SWARadixCache(modules, alloc, config.page_size,
                                                config.sliding_window or 1,
                                                eviction_policy=config.eviction_policy,
                                                is_eagle=config.is_eagle)  # fmt: skip

    unified_mamba = None
    if has_unified_cache(modules) and has_hybrid:

        def unified_mamba(config: PoolConfig, pool: Any, alloc: Any) -> Any:
            from kvpool.sglang.unified_mamba_radix import SGLangUnifiedMambaRadixCache

            return SGLangUnifiedMambaRadixCache(modules, pool, alloc, config.page_size,
                                                tree_core=tree_core)  # fmt: skip

    if unified_mamba is None and has_unified16_cache(modules) and has_hybrid:

        def unified_mamba(config: PoolConfig, pool: Any, alloc: Any) -> Any:
            """0.5.16's FULL+MAMBA ``UnifiedRadixCache`` (kvpool.sglang.unified16_mamba_radix)."""
            from kvpool.sglang.unified16_mamba_radix import SGLangUnified16MambaRadixCache

            return SGLangUnified16MambaRadixCache(modules, pool, alloc, config.page_size)

    def covered(config: PoolConfig) -> bool:
        """The glue drives ``config`` (a host tier only over the unified cache: the host tier
        lives there, so ``+legacy-tree`` runs kvpool's host-tier lifecycle)."""
        return glue_covers(config) and (unified_lifecycle or not config.enable_hierarchical_cache)

    manager = None
    if glue and unified is not None:

        def manager(config: PoolConfig, tree_cache: Any = None) -> Any:
            """SGLang's scheduler glue over its components; a configuration the glue does
            not cover (:func:`glue_covers`) gets kvpool's lifecycle over them, as without
            ``glue`` (kvpool.sglang.glue_manager)."""
            from kvpool.sglang.glue_manager import SGLangGlueManager
            from kvpool.testing.machines.lifecycle import manager_factory

            if config.mamba_slots is not None:  # over the FULL+MAMBA set, the only hybrid manager
                from kvpool.sglang.glue_mamba import SGLangMambaGlueManager

                return SGLangMambaGlueManager(config, modules, tree_core=tree_core,
                                              token_to_kv_pool_allocator=allocator)  # fmt: skip
            if not covered(config):
                if config.enable_hierarchical_cache:  # storage, layer-wise, the legacy tree
                    return host_tier_manager(config)
                return manager_factory(own_lifecycle, unified_lifecycle)(config)
            if config.enable_hierarchical_cache:  # the unified cache's host tier
                from kvpool.sglang.glue_hicache import SGLangHiCacheGlueManager

                return SGLangHiCacheGlueManager(config, modules, tree_core=tree_core,
                                                token_to_kv_pool_allocator=allocator,
                                                req_to_token_pool=req_to_token_pool)  # fmt: skip
            # a disabled cache is a disabled UnifiedRadixCache in 0.5.23's registry, whichever
            # tree an enabled one would be
            legacy = not unified_lifecycle and not config.disable_radix_cache
            tree = tree_cache or (radix_cache if legacy else unified)
            return SGLangGlueManager(config, modules, token_to_kv_pool_allocator=allocator,
                                     req_to_token_pool=req_to_token_pool,
                                     tree_cache=tree)  # fmt: skip

    from kvpool.sglang.glue_v0516 import has_glue_v0516

    def host_tier_manager(config: PoolConfig) -> Any:
        """kvpool's lifecycle and host-tier tree over SGLang's allocator and ``ReqToTokenPool``
        (kvpool's lifecycle does not drive the ``HiRadixCache`` adapter, which the
        ``hiradix_cache`` machine compares on its own)."""
        from kvpool.optimized.lifecycle.memory_manager import MemoryManager

        return MemoryManager(config, checked=True, token_to_kv_pool_allocator=allocator,
                             req_to_token_pool=req_to_token_pool)  # fmt: skip

    manager_v0516 = None
    if glue and unified is None and has_glue_v0516(modules):

        def manager_v0516(config: PoolConfig, tree_cache: Any = None) -> Any:
            """SGLang 0.5.16's scheduler glue over its components (kvpool.sglang.glue_v0516);
            a configuration it does not cover gets kvpool's lifecycle over them."""
            from kvpool.sglang.glue_v0516 import SGLangGlueManagerV0516, glue_covers_v0516
            from kvpool.testing.machines.lifecycle import manager_factory

            covered_here = glue_covers_v0516(config)
            if config.enable_hierarchical_cache and config.mamba_slots is None:
                if not covered_here:  # storage, layer-wise loading
                    return host_tier_manager(config)
                from kvpool.sglang.glue_v0516_host import SGLangHiCacheGlueManagerV0516

                return SGLangHiCacheGlueManagerV0516(
                    config, modules, token_to_kv_pool_allocator=allocator,
                    req_to_token_pool=req_to_token_pool,
                )  # fmt: skip
            if config.mamba_slots is not None:
                from kvpool.sglang.glue_v0516_mamba_radix import mamba_manager_v0516

                return mamba_manager_v0516(config, modules, allocator)
            if not covered_here:
                return manager_factory(own_lifecycle)(config)
            if config.disable_radix_cache:
                from kvpool.sglang.glue_v0516 import SGLangChunkGlueManagerV0516

                return SGLangChunkGlueManagerV0516(
                    config, modules, token_to_kv_pool_allocator=allocator,
                    req_to_token_pool=req_to_token_pool,
                )  # fmt: skip
            return SGLangGlueManagerV0516(config, modules, token_to_kv_pool_allocator=allocator,
                                          req_to_token_pool=req_to_token_pool,
                                          tree_cache=tree_cache or radix_cache)  # fmt: skip

    core = f"-{tree_core}-core" if unified is not None else ""
    built = Implementation(
        label=f"sglang-{modules.version}{core}{'-naive-extend' if naive_extend else ''}",
        allocator=allocator,
        req_to_token_pool=req_to_token_pool,
        radix_cache=radix_cache,
        radix_key=radix_key,
        hybrid_req_to_token_pool=hybrid if has_hybrid else None,
        mamba_steps=mamba_lifecycle if has_hybrid else None,
        mamba_radix_cache=mamba_tree if modules.version in MAMBA_RADIX_RELEASES else None,
        swa_allocator=swa_allocator if swa_alloc_audited else None,
        swa_radix_cache=swa_radix_cache if swa_audited else None,
        rules=rules,
        index=index,
        hiradix_cache=hiradix_cache if _has_hiradix(modules) else unified_hicache,
        unified_radix_cache=unified,
        unified_mamba_radix_cache=unified_mamba,
        unified_swa_radix_cache=unified_swa,
        unified_lifecycle=unified is not None and unified_lifecycle,
        coarse_unified_tree=True,  # its tree cores' snapshots (0.5.16's unified Mamba tree too)
        radix_models_eagle=True,  # its trees are built with CacheInitParams.is_eagle
    )
    if unified is not None:
        built = dataclasses.replace(built, absent=REMOVED_IN_0_5_23)
    own_lifecycle = built
    if manager_v0516 is not None:
        from kvpool.sglang.glue_v0516 import with_glue_v0516
        from kvpool.sglang.glue_v0516_swa import reachability_v0516_swa
        from kvpool.sglang.glue_v0516_swa_radix import swa_manager_factory_v0516

        glued = with_glue_v0516(built, manager_v0516)
        reach_glue = glued.reachability
        assert reach_glue is not None

        def reach_v0516(config: PoolConfig, ops: Sequence[Any]) -> str:
            if config.sliding_window is not None:  # the swa_manager's lifecycle
                return reachability_v0516_swa(config, ops)
            return reach_glue(config, ops)

        # a sliding-window model's lifecycle: 0.5.16's glue over its SWAChunkCache with the
        # radix cache off, over its unified FULL+SWA tree with it on
        # (kvpool.sglang.glue_v0516_swa_radix)
        swa_manager = swa_manager_factory_v0516(modules, naive_extend)
        glued = dataclasses.replace(glued, swa_manager=swa_manager, reachability=reach_v0516)
        return _debugged_managers(modules, glued) if debug_memory_pool else glued
    if manager is None:
        return _debugged_managers(modules, built) if debug_memory_pool else built

    def reach(config: PoolConfig, ops: Sequence[Any]) -> str:
        from kvpool.sglang.glue_hicache import HOST_GLUE_STEPS
        from kvpool.sglang.glue_manager import reachability

        extra = HOST_GLUE_STEPS if config.enable_hierarchical_cache else frozenset()
        return reachability(config, ops, covered=covered(config), extra=extra)

    from kvpool.sglang.glue_swa import swa_manager_factory

    # a sliding-window model's lifecycle: SGLang's glue over its SWA allocator and the tree its
    # registry builds (kvpool.sglang.glue_swa)
    glue_swa = swa_manager_factory(modules, tree_core, naive_extend)
    if not scheduler_checks:
        manager, glue_swa = _unchecked(manager), _unchecked(glue_swa)
    glued = dataclasses.replace(built, manager=manager, manager_runs_hybrid=True,
                                manager_models_eagle=True, manager_models_stops=True,
                                swa_manager=glue_swa, reachability=reach,
                                label=f"{built.label}-glue")  # fmt: skip
    return _debugged_managers(modules, glued) if debug_memory_pool else glued


def _debugged(modules: Any, factory: Callable[..., Any]) -> Callable[..., Any]:
    """``factory``, building SGLang's paged allocators with their debug asserts on."""

    def build(config: PoolConfig, *args: Any, **kwargs: Any) -> Any:
        with debug_asserts(modules):
            return factory(config, *args, **kwargs)

    return build


def _debugged_managers(modules: Any, built: Implementation) -> Implementation:
    """``built`` whose managers (``manager``, ``swa_manager``: they call SGLang's allocators
    as its scheduler does) are built over allocators with SGLang's debug asserts on. The
    component machines (``allocator``, ``swa_allocator``) call them as kvpool's campaign does,
    which includes calls the debug build refuses (an ``alloc`` of part of a page, which the
    default build floors: ``Rules.unaligned_paged_alloc``), so their factories are kept."""
    manager, swa_manager = built.manager, built.swa_manager
    return dataclasses.replace(
        built,
        manager=None if manager is None else _debugged(modules, manager),
        swa_manager=None if swa_manager is None else _debugged(modules, swa_manager),
    )


def _unchecked(factory: Callable[..., Any]) -> Callable[..., Any]:
    """``factory``, whose glue managers leave out SGLang's own scheduler checks."""

    def build(config: PoolConfig, *args: Any) -> Any:
        made = factory(config, *args)
        if hasattr(made, "scheduler_checks"):
            made.scheduler_checks = None
        return made

    return build


REMOVED_IN_0_5_23 = (
    ("mamba_radix_cache", "SGLang 0.5.23 removed mem_cache/mamba_radix_cache.py; a hybrid "
     "model's prefix cache is the unified cache's MAMBA component: --component "
     "unified_radix_cache --tree-components full,mamba"),
    ("swa_radix_cache", "SGLang 0.5.23 removed mem_cache/swa_radix_cache.py; a sliding-window "
     "model's prefix cache is the unified cache's SWA component: --component "
     "unified_radix_cache --tree-components full,swa"),
)  # fmt: skip
"""Components of 0.5.16's adapters that 0.5.23 cannot provide, and why (``kvpool verify``
names the reason)."""


def glue_covers(config: PoolConfig) -> bool:
    """Whether SGLang's glue drives this lifecycle configuration: no layer-wise loading, and a
    host tier only as 0.5.23's unified cache runs it without storage
    (:func:`kvpool.sglang.glue_hicache.covers_host_tier`; kvpool's own lifecycle runs the others
    over SGLang's components). With the radix
    cache disabled the glue runs over a disabled ``UnifiedRadixCache``, which is what 0.5.23's
    registry builds for ``--disable-radix-cache``; a hybrid (Mamba) model runs over its FULL+MAMBA
    set (:mod:`kvpool.sglang.glue_mamba`; with the radix cache on, against kvpool's model of
    that tree in the lifecycle, ``Rules.mamba_tree == "unified"``)."""
    if config.enable_hierarchical_cache:
        from kvpool.sglang.glue_hicache import covers_host_tier

        return covers_host_tier(config)
    return not config.layerwise_loading


def _has_hiradix(modules: Any) -> bool:
    """Whether the release has ``mem_cache/hiradix_cache.py``'s ``HiRadixCache`` (0.5.16)."""
    try:
        return "HiRadixCache" in modules.module("sglang.srt.mem_cache.hiradix_cache").__dict__
    except Exception:  # a release without the file (0.5.23 moved the host tier)
        return False


def implementation_with_host_tier(source: str = "0.5.23", tree_core: str = "rust") -> Any:
    """SGLang ``source``'s implementation without scheduler glue (:func:`implementation`),
    whose ``hiradix_cache`` is :class:`~kvpool.sglang.unified_hicache.SGLangUnifiedHiCache` over
    ``tree_core``, for the ``hiradix_cache`` machine."""
    return implementation(source, tree_core=tree_core, glue=False)


__all__ = ["SPEC_OPTIONS", "from_spec", "implementation", "implementation_with_host_tier"]

"""The implementations kvpool ships, and how a spec string names one (``--impl``).

Specs: ``reference``; ``optimized`` or ``optimized[BACKEND]`` (the torch twin, kernels run by
``torch``, ``interpret`` or ``triton``); either with ``@RELEASE`` (``reference@0.5.23``:
following SGLang RELEASE's rules preset, its lifecycle over the tree that release's server
builds: :func:`following_release`); ``NAME`` or ``NAME:ARGS`` of an implementation plug-in
(:mod:`kvpool.testing.plugins`), such as ``sglang`` or ``sglang:SOURCE`` (SGLang's own classes
through :mod:`kvpool.sglang`; SOURCE is a release like ``0.5.16``, a source path or
``installed``; suffixes: ``+naive`` routes ``alloc_extend`` through SGLang's naive path,
``+python-core`` / ``+rust-core`` choose 0.5.23's unified-cache tree core, ``+legacy-tree``
keeps the lifecycle on the legacy ``RadixCache``: :func:`kvpool.sglang.from_spec`);
``MODULE:NAME`` or ``path/to/file.py:NAME`` (a user's object: an
:class:`~kvpool.testing.bundle.Implementation`, a zero-argument callable returning one, or a
plain factory of the component being verified). Specs are strings so that worker processes
rebuild the same implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvpool.config import PoolConfig
from kvpool.rules import Rules, server_builds_unified_tree
from kvpool.testing.bundle import Implementation
from kvpool.testing.plugins import find_plugin

if TYPE_CHECKING:  # torch is imported when the twin is built, not with the harness
    from kvpool.optimized.options import TwinOptions


def reference_implementation() -> Implementation:
    """Every component of the pure-Python reference."""
    from kvpool.reference import radix_key
    from kvpool.reference.kv.layer_transfer import LayerDoneCounter
    from kvpool.reference.kv.storage import kv_cache_from_config
    from kvpool.reference.lifecycle.memory_manager import MemoryManager
    from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager
    from kvpool.reference.mamba import lifecycle as mamba_lifecycle
    from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
    from kvpool.reference.mamba.radix_cache import MambaRadixCache
    from kvpool.reference.pools.allocator_choice import allocator_for
    from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
    from kvpool.reference.radix.radix_cache import RadixCache
    from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
    from kvpool.reference.swa.radix_cache import SWARadixCache

    def allocator(config: PoolConfig) -> Any:
        return allocator_for(config.size, config.page_size, config.need_sort, rules=config.rules)

    def table(config: PoolConfig) -> Any:
        return ReqToTokenPool(config.req_pool_size, config.max_context_len, rules=config.rules)

    def tree(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        return RadixCache(pool, alloc, config.page_size, False, config.eviction_policy,
                          rules=config.rules, is_eagle=config.is_eagle)  # fmt: skip

    def mamba_tree(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        return MambaRadixCache(pool, alloc, config.page_size)

    def unified_mamba(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        from kvpool.reference.unified.mamba_radix_cache import UnifiedMambaRadixCache

        return UnifiedMambaRadixCache(pool, alloc, config.page_size, rules=config.rules)

    def unified(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        from kvpool.reference.unified.radix_cache import UnifiedRadixCache

        return UnifiedRadixCache(pool, alloc, config.page_size, False, config.eviction_policy,
                                 rules=config.rules, is_eagle=config.is_eagle)  # fmt: skip

    def hybrid(config: PoolConfig) -> Any:
        return HybridReqToTokenPool(config.req_pool_size, config.max_context_len,
                                    _mamba_slots(config), config.mamba_layers,
                                    config.mamba_track_buffers, rules=config.rules)  # fmt: skip

    return Implementation(
        "reference",
        allocator=allocator,
        req_to_token_pool=table,
        radix_cache=tree,
        radix_key=radix_key.RadixKey,
        manager=MemoryManager,
        manager_models_eagle=True,
        manager_models_stops=True,
        radix_models_eagle=True,
        hybrid_req_to_token_pool=hybrid,
        mamba_steps=mamba_lifecycle,
        mamba_radix_cache=mamba_tree,
        swa_allocator=lambda config: SWATokenToKVPoolAllocator(
            config.size, config.swa_size, config.page_size, config.need_sort, rules=config.rules
        ),
        swa_radix_cache=lambda config, alloc: SWARadixCache(
            alloc, config.page_size, config.sliding_window or 1, is_eagle=config.is_eagle
        ),
        swa_manager=SWAMemoryManager,
        hiradix_cache=_reference_hiradix,
        kv_cache=kv_cache_from_config,
        layer_done_counter=LayerDoneCounter,
        unified_radix_cache=unified,
        unified_mamba_radix_cache=unified_mamba,
        unified_swa_radix_cache=_reference_unified_swa,
    )


def _reference_unified_swa(config: PoolConfig, alloc: Any) -> Any:
    """The reference ``UnifiedSWARadixCache`` (SGLang 0.5.23's FULL+SWA tree) over ``alloc``."""
    from kvpool.reference.unified.swa_radix_cache import UnifiedSWARadixCache

    return UnifiedSWARadixCache(alloc, config.page_size, config.sliding_window or 1,
                                eviction_policy=config.eviction_policy,
                                rules=config.rules, is_eagle=config.is_eagle)  # fmt: skip


def _optimized_unified_swa(config: PoolConfig, alloc: Any, options: TwinOptions) -> Any:
    """The twin's ``UnifiedSWARadixCache`` over ``alloc``, run by ``options``."""
    from kvpool.optimized.unified.swa_radix_cache import UnifiedSWARadixCache

    return UnifiedSWARadixCache(alloc, config.page_size, config.sliding_window or 1,
                                eviction_policy=config.eviction_policy, rules=config.rules,
                                options=options, is_eagle=config.is_eagle)  # fmt: skip


def _reference_hiradix(config: PoolConfig, pool: Any, alloc: Any) -> Any:
    """The reference ``HiRadixCache`` with its own KV buffers and host pool (``config``)."""
    from kvpool.reference.hicache.hiradix_cache import HiRadixCache
    from kvpool.reference.hicache.memory_pool_host import host_pool_for
    from kvpool.reference.kv.storage import kv_cache_from_config

    host = host_pool_for(kv_cache_from_config(config), config.hicache_ratio)
    return HiRadixCache(pool, alloc, config.page_size, host, False, config.eviction_policy,
                        None, config.hicache_write_policy, config.hicache_load_back_threshold,
                        config.hicache_prefetch_threshold, config.hicache_storage,
                        rules=config.rules, is_eagle=config.is_eagle)  # fmt: skip


def _optimized_hiradix(config: PoolConfig, pool: Any, alloc: Any, options: TwinOptions) -> Any:
    """The twin's ``HiRadixCache`` with its own KV buffers and host pool (``config``), all run
    by ``options``."""
    from kvpool.optimized.hicache.hiradix_cache import HiRadixCache
    from kvpool.optimized.hicache.memory_pool_host import host_pool_for
    from kvpool.optimized.kv.storage import kv_cache_from_config

    host = host_pool_for(kv_cache_from_config(config, options), config.hicache_ratio)
    return HiRadixCache(pool, alloc, config.page_size, host, False, config.eviction_policy,
                        None, config.hicache_write_policy, config.hicache_load_back_threshold,
                        config.hicache_prefetch_threshold, config.hicache_storage,
                        rules=config.rules, options=options,
                        is_eagle=config.is_eagle)  # fmt: skip


def optimized_implementation(backend: str | None = "torch", checked: bool = True) -> Implementation:
    """Every component of the torch twin on the CPU, its kernels run by ``backend``: one
    :class:`~kvpool.optimized.options.TwinOptions` (the CPU, ``checked``, ``backend``) is built
    here and every factory hands it to what it builds (``options=``), so no component runs with
    another backend or checked mode."""
    import torch

    from kvpool.optimized import radix_key
    from kvpool.optimized.kv.layer_transfer import LayerDoneCounter
    from kvpool.optimized.kv.storage import kv_cache_from_config
    from kvpool.optimized.lifecycle.memory_manager import MemoryManager
    from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager
    from kvpool.optimized.mamba import lifecycle as mamba_lifecycle
    from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
    from kvpool.optimized.mamba.radix_cache import MambaRadixCache
    from kvpool.optimized.options import TwinOptions
    from kvpool.optimized.pools.allocator_choice import allocator_for
    from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
    from kvpool.optimized.radix.radix_cache import RadixCache
    from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator
    from kvpool.optimized.swa.radix_cache import SWARadixCache

    if torch.get_num_threads() != 1:  # tiny tensors: OpenMP workers only contend
        torch.set_num_threads(1)
    opts = TwinOptions.make(checked=checked, backend=backend)

    def allocator(config: PoolConfig) -> Any:
        return allocator_for(config.size, config.page_size, config.need_sort,
                             rules=config.rules, options=opts)  # fmt: skip

    def table(config: PoolConfig) -> Any:
        return ReqToTokenPool(
            config.req_pool_size, config.max_context_len, rules=config.rules, options=opts
        )

    def tree(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        return RadixCache(pool, alloc, config.page_size, False, config.eviction_policy,
                          rules=config.rules, options=opts, is_eagle=config.is_eagle)  # fmt: skip

    def manager(config: PoolConfig, **parts: Any) -> Any:
        """The twin's lifecycle; ``parts``: components by keyword (``tree_cache=`` the unified
        tree's factory: :func:`~kvpool.testing.machines.lifecycle.manager_factory`)."""
        return MemoryManager(config, options=opts, **parts)

    def unified(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        from kvpool.optimized.unified.radix_cache import UnifiedRadixCache

        return UnifiedRadixCache(pool, alloc, config.page_size, False, config.eviction_policy,
                                 rules=config.rules, options=opts,
                                 is_eagle=config.is_eagle)  # fmt: skip

    def mamba_tree(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        return MambaRadixCache(pool, alloc, config.page_size, options=opts)

    def unified_mamba(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        from kvpool.optimized.unified.mamba_radix_cache import UnifiedMambaRadixCache

        return UnifiedMambaRadixCache(pool, alloc, config.page_size, rules=config.rules,
                                      options=opts)  # fmt: skip

    def hybrid(config: PoolConfig) -> Any:
        return HybridReqToTokenPool(config.req_pool_size, config.max_context_len,
                                    _mamba_slots(config), config.mamba_layers,
                                    config.mamba_track_buffers, rules=config.rules,
                                    options=opts)  # fmt: skip

    def swa_allocator(config: PoolConfig) -> Any:
        return SWATokenToKVPoolAllocator(config.size, config.swa_size, config.page_size,
                                         config.need_sort, rules=config.rules,
                                         options=opts)  # fmt: skip

    def index(values: Sequence[int]) -> Any:
        return torch.tensor(list(values), dtype=torch.int64)

    return Implementation(
        f"optimized[{backend}]",
        allocator=allocator,
        req_to_token_pool=table,
        radix_cache=tree,
        radix_key=radix_key.RadixKey,
        manager=manager,
        manager_models_eagle=True,
        manager_models_stops=True,
        radix_models_eagle=True,
        hybrid_req_to_token_pool=hybrid,
        mamba_steps=mamba_lifecycle,
        mamba_radix_cache=mamba_tree,
        swa_allocator=swa_allocator,
        swa_radix_cache=lambda config, alloc: SWARadixCache(
            alloc,
            config.page_size,
            config.sliding_window or 1,
            options=opts,
            is_eagle=config.is_eagle,
        ),
        swa_manager=lambda config: SWAMemoryManager(config, options=opts),
        index=index,
        hiradix_cache=lambda config, pool, alloc: _optimized_hiradix(config, pool, alloc, opts),
        kv_cache=lambda config: kv_cache_from_config(config, opts),
        # Single-threaded machines: nothing else can complete a layer, so a short wait
        # turns an early read into the reference's LayerNotLoadedError.
        layer_done_counter=lambda layers: LayerDoneCounter(layers, timeout=0.002),
        unified_radix_cache=unified,
        unified_swa_radix_cache=lambda config, alloc: _optimized_unified_swa(config, alloc, opts),
        unified_mamba_radix_cache=unified_mamba,
    )


def _mamba_slots(config: PoolConfig) -> int:
    """Mamba slots of a hybrid pool: ``config.mamba_slots``, or one per row when unset."""
    return config.mamba_slots if config.mamba_slots is not None else config.req_pool_size


def following_release(impl: Implementation, release: str) -> Implementation:
    """``impl`` following SGLang ``release``'s rules preset (:meth:`Rules.for_sglang`), its
    lifecycle over the tree that release's server builds for an ordinary model (the unified
    radix cache from 0.5.23 on: :func:`~kvpool.rules.server_builds_unified_tree`), labelled
    ``LABEL@RELEASE``. kvpool's twins verified as they run when they stand in for that release.
    ConfigError for a release without a preset."""
    return replace(
        impl,
        label=f"{impl.label}@{release}",
        rules=Rules.for_sglang(release),
        unified_lifecycle=server_builds_unified_tree(release),
    )


def builtin_spec(spec: str) -> bool:
    """Whether ``spec`` names one of kvpool's own implementations (``reference`` or
    ``optimized[...]``, with or without ``@RELEASE``)."""
    name = spec.partition("@")[0]
    return name in ("reference", "optimized") or (
        name.startswith("optimized[") and name.endswith("]")
    )


def resolve_implementation(spec: str, component: str = "manager") -> Implementation:
    """The implementation a spec names (see the module docstring). ValueError for a malformed
    spec, ImportError for a missing module, TypeError for an object of the wrong kind,
    ConfigError for an ``@RELEASE`` without a rules preset."""
    if builtin_spec(spec) and "@" in spec:
        name, _, release = spec.partition("@")
        return following_release(resolve_implementation(name, component), release)
    if spec == "reference":
        return reference_implementation()
    if spec == "optimized" or spec.startswith("optimized["):
        backend = spec[len("optimized[") : -1] if spec.endswith("]") else "torch"
        if backend not in ("torch", "interpret", "triton"):
            raise ValueError(f"unknown kernel backend {backend!r} in {spec!r}")
        return optimized_implementation(backend)
    name, _, args = spec.partition(":")
    plugin = find_plugin(name)
    if plugin is not None:
        return plugin.resolve(args)
    from kvpool.testing.factories import load_factory

    obj: Any = load_factory(spec)
    if isinstance(obj, Implementation):
        return obj
    try:
        made = obj() if _takes_no_arguments(obj) else None
    except TypeError:
        made = None
    if isinstance(made, Implementation):
        return made
    parts: dict[str, Any] = {component: obj}
    return Implementation(spec, **parts)


def _takes_no_arguments(fn: Any) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in params)  # fmt: skip


__all__ = [
    "builtin_spec",
    "following_release",
    "optimized_implementation",
    "reference_implementation",
    "resolve_implementation",
]

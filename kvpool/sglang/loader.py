"""Load SGLang's memory-pool classes without SGLang's heavy dependencies.

:func:`load_sglang` resolves a source (:func:`kvpool.sglang.source.resolve_source`: an installed
package, a path or a release number), installs a :class:`~kvpool.sglang.importer.PrivateSGLang`
finder for it and returns :class:`SGLangModules`, a handle on the loaded classes. What is real
and what is stubbed (see specs/sglang.md for why the stubs do not change what is tested):

- real (SGLang's own file, executed): :data:`REAL_MODULES`;
- partial (only the named definitions, plus what they reach): :data:`PARTIAL_MODULES`;
- everything else under ``sglang`` and every third-party package but torch, triton and numpy:
  stubs (:mod:`kvpool.sglang.stubs`).

SGLang's Triton allocation kernels run through Triton's interpreter on CPU tensors, whatever
``TRITON_INTERPRET`` says and whether or not triton was imported first: after loading, the
paged module's kernels are replaced by :class:`kvpool.sglang.kernels.KernelSwitch` (the
decorator's ``JITFunction`` unwrapped to its Python function and re-wrapped as an interpreter
function), so kvpool's ``checked_interpreter`` also applies to them.
"""

from __future__ import annotations

import hashlib
import os
import re
import types
from dataclasses import dataclass
from typing import Any

from kvpool.sglang.debug_pool import install_debug_switch
from kvpool.sglang.glue import install_stand_ins
from kvpool.sglang.importer import PrivateSGLang
from kvpool.sglang.kernels import install_kernel_switches
from kvpool.sglang.source import SGLangSource, resolve_source

REAL_MODULES = (
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.allocator.base",
    "sglang.srt.mem_cache.allocator.token",
    "sglang.srt.mem_cache.allocator.paged",
    "sglang.kernels.ops.memory.allocator",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.evict_policy",
    "sglang.srt.mem_cache.utils",
    "sglang.srt.mem_cache.events",
    "sglang.srt.mem_cache.session_radix_cache",
    "sglang.srt.mem_cache.hiradix_cache",
    "sglang.srt.mem_cache.allocator.mamba",
    "sglang.srt.mem_cache.mamba_radix_cache",
    "sglang.srt.mem_cache.allocator.swa",
    "sglang.srt.mem_cache.base_swa_memory_pool",
    "sglang.srt.mem_cache.swa_radix_cache",
)
"""SGLang modules executed from SGLang's own source (the behaviour under test lives here)."""

UNIFIED_MODULES = (
    "sglang.srt.environ",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.unified_cache",
    "sglang.srt.mem_cache.unified_cache.component_type",
    "sglang.srt.mem_cache.unified_cache.cache_action",
    "sglang.srt.mem_cache.unified_cache.components",
    "sglang.srt.mem_cache.unified_cache.components.base",
    "sglang.srt.mem_cache.unified_cache.components.full",
    "sglang.srt.mem_cache.unified_cache.components.swa",
    "sglang.srt.mem_cache.unified_cache.components.mamba",
    "sglang.srt.mem_cache.unified_cache.tree_core_registry",
    "sglang.srt.mem_cache.unified_cache.unified_tree_core",
    "sglang.srt.mem_cache.unified_cache.unified_tree_core_interface",
    "sglang.srt.mem_cache.unified_cache.session_ref_tracker",
    "sglang.srt.mem_cache.unified_cache.unified_cache_linker",
    "sglang.srt.mem_cache.unified_cache.storage_attachment",
    "sglang.srt.mem_cache.rust_tree_core",
    "sglang.srt.mem_cache.rust_tree_core.adapter",
    "sglang.srt.rust_extensions.torch_build",
    "sglang.srt.mem_cache.allocator.page_interleave",
    "sglang.srt.session.streaming_session",
    # the scheduler's memory glue (kvpool.sglang.glue_manager): allocation and release
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.mem_cache.common",
    # the host tier's transfer records (PoolName, PoolTransfer: kvpool.sglang.unified_hicache)
    "sglang.srt.mem_cache.hicache_storage",
    # the scheduler's own pool checks ("Mem Leak Detected"): kvpool.sglang.scheduler_checker
    "sglang.srt.managers.scheduler_components.pool_stats_observer",
    "sglang.srt.managers.scheduler_components.invariant_checker",
)
"""Also real for a release with the unified radix cache (0.5.23; :data:`UNIFIED_MARKER`): the
cache, its tree cores and components, the tree-core registry, SGLang's environment switches
(``envs``: their defaults, or the process environment, as a server reads them), and the
modules those paths call. The Rust tree core's compiled module is loaded by
:func:`kvpool.sglang.tree_core.install_rust_tree_core`."""

UNIFIED_MARKER = "sglang/srt/mem_cache/unified_cache/tree_core_registry.py"
"""A source holding this file gets :data:`UNIFIED_MODULES` too: the tree-core registry of
0.5.23's unified cache (0.5.16 also ships a ``unified_radix_cache.py``, an earlier design used
only for hybrid models, without tree cores: :data:`UNIFIED16_MODULES`)."""

UNIFIED16_MODULES = (
    "sglang.srt.environ",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.unified_cache_components",
    "sglang.srt.mem_cache.unified_cache_components.full_component",
    "sglang.srt.mem_cache.unified_cache_components.swa_component",
    "sglang.srt.mem_cache.unified_cache_components.mamba_component",
    "sglang.srt.mem_cache.unified_cache_components.tree_component",
    "sglang.srt.session.streaming_session",
    "sglang.srt.mem_cache.hicache_storage",
)
"""Also real for 0.5.16 (a source holding :data:`UNIFIED16_MARKER`): the earlier
``UnifiedRadixCache`` its registry builds for a hybrid model with the radix cache on (Python tree
nodes, one component per file), SGLang's environment switches (``envs``: their defaults, or the
process environment; every switch the other real modules of the release read defaults to what
the stubs answered) and the two modules the cache imports and calls
(:mod:`kvpool.sglang.unified16_swa_radix`, :mod:`kvpool.sglang.unified16_mamba_radix`)."""

UNIFIED16_MARKER = "sglang/srt/mem_cache/unified_cache_components/tree_component.py"
"""A source without :data:`UNIFIED_MARKER` that holds this file gets :data:`UNIFIED16_MODULES`."""

_COMMON = "sglang/srt/utils/common.py"
_HELPERS = ("next_power_of_2", "get_num_new_pages", "ceil_align", "raise_error_or_warn?")
PARTIAL_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    # memory_pool.py imports the KV-cache kernels, JIT kernels and quantisation: take only the
    # ReqToTokenPool class, and the hybrid model's MambaPool and HybridReqToTokenPool where
    # the release has them (and the module-level names they use).
    "sglang.srt.mem_cache.memory_pool": (
        "sglang/srt/mem_cache/memory_pool.py",
        ("ReqToTokenPool", "MambaPool?", "HybridReqToTokenPool?"),
    ),
    # utils/common.py imports most of SGLang's runtime: take the page arithmetic helpers the
    # allocators and the radix cache call (``sglang.srt.utils`` re-exports them), and the
    # reporter the scheduler's pool checks raise through (kvpool.sglang.scheduler_checker).
    "sglang.srt.utils": (_COMMON, _HELPERS),
    "sglang.srt.utils.common": (_COMMON, _HELPERS),
    # mem_cache/common.py holds the scheduler's cache helpers; 0.5.23's RadixCache.free_kv_row
    # calls two of them (absent in 0.5.16, hence optional).
    "sglang.srt.mem_cache.common": (
        "sglang/srt/mem_cache/common.py",
        ("coalesce_ranges?", "free_kv_row_segments?"),
    ),
    # allocation_sizing.py: 0.5.23's HybridReqToTokenPool sizes its track buffers with
    # get_mamba_tracking_slots (a pure function; the module's other helpers read server args).
    "sglang.srt.mem_cache.allocation_sizing": (
        "sglang/srt/mem_cache/allocation_sizing.py",
        ("get_mamba_tracking_slots?",),
    ),
    # pool_host/base.py: the host KV pool; its allocator (clear / alloc / free) runs on the CPU,
    # its constructor needs psutil and the host buffers (the adapter does without it).
    "sglang.srt.mem_cache.pool_host.base": (
        "sglang/srt/mem_cache/pool_host/base.py",
        ("HostKVCache",),
    ),
}
"""Module -> (file, names): only those definitions are real (a name ending in ``?`` when the
release defines it); other attributes are stubs."""

GLUE_MARKER = "sglang/srt/mem_cache/allocation.py"
"""A release without the unified cache (0.5.16) that holds this file gets
:data:`GLUE_PARTS`: its scheduler's memory glue (:mod:`kvpool.sglang.glue_v0516`)."""

GLUE_PARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # the glue itself, real (no real module of these releases imports either)
    ("sglang.srt.mem_cache.allocation", "", ()),
    ("sglang.srt.mem_cache.common", "", ()),
    # the tree 0.5.16's registry builds for --disable-radix-cache (its only imports besides the
    # real base_prefix_cache and allocator/swa: a DeepSeek-V4 allocator class, a stub, that only
    # SWAChunkCache's constructor checks against)
    ("sglang.srt.mem_cache.chunk_cache", "", ()),
    # alloc_for_extend builds the request's KV record from schedule_batch.py's ReqKvInfo (a
    # dataclass); write_cache_indices asks support_triton (utils/common.py) for its writer
    ("sglang.srt.managers.schedule_batch", "sglang/srt/managers/schedule_batch.py",
     ("ReqKvInfo?",)),
    ("sglang.srt.utils", _COMMON, (*_HELPERS, "support_triton?")),
    ("sglang.srt.utils.common", _COMMON, (*_HELPERS, "support_triton?")),
)  # fmt: skip
"""Module, file, names: real when the file is empty, else partial (see :data:`PARTIAL_MODULES`)."""

_LOADED: dict[str, SGLangModules] = {}


@dataclass(frozen=True)
class SGLangModules:
    """SGLang's memory-pool classes loaded from one source (see :func:`load_sglang`)."""

    source: SGLangSource
    importer: PrivateSGLang

    @property
    def version(self) -> str:
        """The release number read from the source (``0.0.0`` if it has none)."""
        return self.source.version

    def module(self, dotted: str) -> types.ModuleType:
        """The loaded module ``dotted`` (its real SGLang name, e.g.
        ``sglang.srt.mem_cache.allocator.paged``), loading it on first use."""
        return self.importer.import_module(dotted)

    def attr(self, dotted: str, name: str, default: Any = None) -> Any:
        """Attribute ``name`` of module ``dotted`` (``default`` if the release lacks it)."""
        return self.module(dotted).__dict__.get(name, default)


def _no_custom_mem_pool(memory_pool: types.ModuleType) -> None:
    """``MambaPool`` asks ``maybe_init_custom_mem_pool`` (real, in ``mem_cache/utils.py``) for
    the PD-disaggregation memory pool, which tests an environment switch for ``is not None``: a
    stub's value is not None. Its answer with the switch unset is ``(False, None, None)``."""
    memory_pool.__dict__["maybe_init_custom_mem_pool"] = lambda device: (False, None, None)


class _CPUPlatform:
    """What 0.5.23's SWA allocator asks ``current_platform`` (a stub here) on this CPU run: no
    platform paged-allocator class (``None``: SGLang's own ``PagedTokenToKVPoolAllocator``, as
    on CUDA, whose platform does not override it)."""

    @staticmethod
    def get_paged_allocator_cls() -> None:
        return None

    @staticmethod
    def is_pin_memory_available(device: Any = None) -> bool:
        """No pinned host memory without an accelerator (SGLang's base and CPU platforms)."""
        return False

    @staticmethod
    def synchronize() -> None:
        """Nothing to wait for on a CPU (SGLang's base platform: a no-op)."""


def _host_tensor(args: list[int], *, dtype: Any, device: Any) -> Any:
    """0.5.23's ``async_h2d`` on a CPU device (no pinned staging): the list as a tensor."""
    import torch

    return torch.tensor(args, dtype=dtype).to(device)


def _cpu_swa_allocator(modules: SGLangModules) -> None:
    """0.5.23's ``allocator/swa.py`` imports ``current_platform`` and ``async_h2d`` from modules
    the loader stubs: give them their CPU answers (:class:`_CPUPlatform`, :func:`_host_tensor`);
    a release whose SWA allocator does not import them is left alone. Its other stubbed import,
    ``utils.invariants.expect``, is a no-op, as SGLang's is at its default check level
    (``SGLANG_INVARIANT_CHECK`` unset: off)."""
    swa = modules.module("sglang.srt.mem_cache.allocator.swa").__dict__
    if "current_platform" in swa:
        swa["current_platform"] = _CPUPlatform()
    if "async_h2d" in swa:
        swa["async_h2d"] = _host_tensor


def _cpu_hybrid_pool(modules: SGLangModules) -> None:
    """0.5.23's ``MambaPool`` / ``HybridReqToTokenPool`` (``memory_pool.py``, partial) call
    ``async_h2d`` (``utils/common.py``, stubbed) for the rows they map and hold
    ``current_platform`` (``synchronize`` in host copies): their CPU answers, as for the SWA
    allocator. ``get_mamba_tracking_slots`` is SGLang's own (:data:`PARTIAL_MODULES`)."""
    pool = modules.module("sglang.srt.mem_cache.memory_pool").__dict__
    if "async_h2d" in pool:
        pool["async_h2d"] = _host_tensor
        if "current_platform" in pool:
            pool["current_platform"] = _CPUPlatform()


def _prefix(source: SGLangSource) -> str:
    digest = hashlib.sha1(source.key().encode()).hexdigest()[:8]
    return f"_kvpool_sglang_{re.sub(r'[^0-9A-Za-z]', '_', source.version)}_{digest}"


def load_sglang(
    source: str = "0.5.16", *, cache_dir: str | os.PathLike[str] | None = None
) -> SGLangModules:
    """SGLang's memory-pool modules from ``source``: ``"installed"``, a path (wheel, checkout,
    folder holding ``sglang/``) or a release number, downloaded into ``cache_dir`` (default
    ``$KVPOOL_SGLANG_CACHE`` or ``~/.cache/kvpool/sglang``). Loaded once per source per process.
    Raises :class:`~kvpool.errors.SGLangLoadError` when there is no SGLang there or a module the
    adapters need is missing."""
    resolved = resolve_source(source, cache_dir)
    known = _LOADED.get(resolved.key())
    if known is not None:
        return known
    real: tuple[str, ...] = REAL_MODULES
    partial = dict(PARTIAL_MODULES)
    unified = UNIFIED_MARKER in resolved.names(UNIFIED_MARKER.rpartition("/")[0] + "/")
    if unified:
        real = REAL_MODULES + UNIFIED_MODULES
        partial = {k: v for k, v in partial.items() if k not in UNIFIED_MODULES}
    elif GLUE_MARKER in resolved.names(GLUE_MARKER.rpartition("/")[0] + "/"):
        real = real + tuple(m for m, f, _ in GLUE_PARTS if not f)
        if UNIFIED16_MARKER in resolved.names(UNIFIED16_MARKER.rpartition("/")[0] + "/"):
            real = real + UNIFIED16_MODULES
        partial = {k: v for k, v in partial.items() if k not in real}
        partial.update({m: (f, names) for m, f, names in GLUE_PARTS if f})
    importer = PrivateSGLang(resolved, _prefix(resolved), real, partial)
    importer.install()
    modules = SGLangModules(resolved, importer)
    try:
        install_kernel_switches(modules.module("sglang.srt.mem_cache.allocator.paged"))
        install_debug_switch(modules.module("sglang.srt.mem_cache.allocator.paged"))
        _no_custom_mem_pool(modules.module("sglang.srt.mem_cache.memory_pool"))
        if unified:  # before any glue module binds them (kvpool.sglang.glue)
            install_stand_ins(
                modules.module("sglang.srt.runtime_context"),
                modules.module("sglang.srt.utils.common"),
            )
        _cpu_swa_allocator(modules)
        _cpu_hybrid_pool(modules)
    except BaseException:
        importer.uninstall()
        raise
    _LOADED[resolved.key()] = modules
    return modules


__all__ = [
    "GLUE_MARKER",
    "GLUE_PARTS",
    "PARTIAL_MODULES",
    "REAL_MODULES",
    "UNIFIED16_MARKER",
    "UNIFIED16_MODULES",
    "UNIFIED_MARKER",
    "UNIFIED_MODULES",
    "SGLangModules",
    "load_sglang",
]

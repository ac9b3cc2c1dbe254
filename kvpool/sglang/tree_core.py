"""SGLang 0.5.23's unified radix cache and its two tree cores, loaded for real.

A release with ``mem_cache/unified_radix_cache.py`` chooses the cache's tree core in
``unified_cache/tree_core_registry.py``: ``"rust"`` by default (the compiled extension
``mem_cache/rust_tree_core/mem_cache.*.so`` behind ``rust_tree_core/adapter.py``) or
``"python"`` (``unified_cache/unified_tree_core.py``). :func:`load_unified` makes both
available to the private loader (:mod:`kvpool.sglang.loader`):

- **msgspec** must be the real package (the cache's parameter and action records are
  ``msgspec.Struct``); without it loading refuses with :class:`~kvpool.errors.SGLangLoadError`
  naming the extra to install;
- **the Rust extension** is loaded from the wheel (extracted once, see
  :meth:`~kvpool.sglang.source.SGLangSource.binary_path`) after torch, as SGLang's own
  ``rust_tree_core/extension.py`` does, registered in ``sys.modules`` under the private name
  of ``sglang.srt.mem_cache.rust_tree_core.mem_cache`` and handed to the adapter as
  ``extension.bindings``; the registry's ``_RUST_TREE_CORE_MODULE`` (the name whose presence
  in ``sys.modules`` means "the bundled extension is loaded, no source build") is set to that
  private name, so SGLang's own fallback policy runs unchanged and keeps the Rust core. SGLang's
  ``extension.py`` itself is not run: it would look for a Cargo workspace and a build cache.

Nothing here touches a user's own ``sglang`` in ``sys.modules``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from dataclasses import dataclass
from typing import Any

from kvpool.errors import SGLangLoadError
from kvpool.sglang.loader import UNIFIED_MARKER, SGLangModules

TREE_CORES = ("rust", "python")
"""The tree cores of 0.5.23's unified cache, SGLang's default first."""

_RUST_DIR = "sglang/srt/mem_cache/rust_tree_core/"
_RUST_MODULE = "sglang.srt.mem_cache.rust_tree_core.mem_cache"
_REGISTRY = "sglang.srt.mem_cache.unified_cache.tree_core_registry"
_CACHE = "sglang.srt.mem_cache.unified_radix_cache"


@dataclass(frozen=True)
class UnifiedModules:
    """SGLang's unified radix cache loaded from one source, with the Rust core registered."""

    modules: SGLangModules
    cache_module: types.ModuleType
    component_type: Any
    """SGLang's ``ComponentType`` enum (``FULL``, ``SWA``, ``MAMBA``)."""

    def components(self, names: tuple[str, ...]) -> tuple[Any, ...]:
        """``ComponentType`` members for lower-case names (``("full", "swa")``)."""
        return tuple(self.component_type[name.upper()] for name in names)


def has_unified_cache(modules: SGLangModules) -> bool:
    """Whether the source holds 0.5.23's unified radix cache."""
    folder = UNIFIED_MARKER.rpartition("/")[0] + "/"
    return UNIFIED_MARKER in modules.source.names(folder)


def _install_rust(modules: SGLangModules) -> None:
    import torch  # noqa: F401  (libtorch must be resident before the extension is opened)

    private = f"{modules.importer.prefix}.{_RUST_MODULE}"
    if private in sys.modules:
        return
    found = [n for n in modules.source.names(_RUST_DIR) if n.rpartition("/")[2].startswith(
        "mem_cache.") and n.endswith(".so")]  # fmt: skip
    if not found:
        raise SGLangLoadError(f"{modules.source.origin} has no compiled Rust tree core")
    path = str(modules.source.binary_path(found[0]))
    loader = importlib.machinery.ExtensionFileLoader(private, path)
    spec = importlib.util.spec_from_file_location(private, path, loader=loader)
    if spec is None:
        raise SGLangLoadError(f"cannot load the Rust tree core from {path}")
    extension = importlib.util.module_from_spec(spec)
    try:
        loader.exec_module(extension)
    except ImportError as exc:
        raise SGLangLoadError(f"the Rust tree core at {path} does not import: {exc}") from None
    sys.modules[private] = extension
    stub = modules.module("sglang.srt.mem_cache.rust_tree_core.extension")
    stub.__dict__["bindings"] = extension
    modules.module(_REGISTRY).__dict__["_RUST_TREE_CORE_MODULE"] = private


_LOADED: dict[str, UnifiedModules] = {}


def load_unified(modules: SGLangModules) -> UnifiedModules:
    """The unified cache of ``modules`` with both tree cores available (see the module
    docstring); once per source. Raises :class:`~kvpool.errors.SGLangLoadError` for a release
    without the unified cache, without msgspec, or whose Rust core does not load."""
    known = _LOADED.get(modules.source.key())
    if known is not None:
        return known
    if not has_unified_cache(modules):
        raise SGLangLoadError(
            f"SGLang {modules.version} has no unified radix cache with tree cores "
            "(mem_cache/unified_cache/tree_core_registry.py)"
        )
    if importlib.util.find_spec("msgspec") is None:
        raise SGLangLoadError(
            "SGLang's unified radix cache needs the msgspec package: pip install 'kvpool[sglang]'"
        )
    _install_rust(modules)
    cache_module = modules.module(_CACHE)
    kind = modules.attr("sglang.srt.mem_cache.unified_cache.component_type", "ComponentType")
    loaded = UnifiedModules(modules, cache_module, kind)
    _LOADED[modules.source.key()] = loaded
    return loaded


__all__ = ["TREE_CORES", "UnifiedModules", "has_unified_cache", "load_unified"]

"""What the adapters of SGLang 0.5.16's ``UnifiedRadixCache`` share, whatever their component
set (FULL+SWA: :mod:`kvpool.sglang.unified16_swa_radix`; FULL+MAMBA:
:mod:`kvpool.sglang.unified16_mamba_radix`).

0.5.16's unified cache (``mem_cache/unified_radix_cache.py`` with
``mem_cache/unified_cache_components/``) is the tree its registry builds for a hybrid model with
the radix cache on. It is an earlier design than 0.5.23's (:mod:`kvpool.sglang.unified_base`):
no tree cores, the tree is ``UnifiedTreeNode`` Python objects, a lock returns
``IncLockRefResult(swa_uuid_for_lock, skip_lock_node_ids)``. What the adapters do about it:

- **Building** SGLang's cache from ``CacheInitParams(tree_components=...)`` (the loader makes
  this release's unified modules real: :data:`~kvpool.sglang.loader.UNIFIED16_MODULES`);
  :func:`has_unified16_cache` says whether a source has them.
- **Node numbering.** ``UnifiedTreeNode.counter`` is a class attribute shared by every cache
  of the process, and a reset mints the root and two sentinel nodes for each LRU list (a
  device and a host list per component). kvpool numbers the root 0 and the first node minted
  after a reset 1 (:meth:`Unified16Base.snapshot_id`). Every way into the tree that can mint a
  node (the adapter's calls and SGLang's own callers: ``insert``, ``match_prefix``,
  ``cache_finished_req``, ``cache_unfinished_req``, ``reset``) runs in :meth:`Unified16Base._call`,
  which loads this cache's counter and saves it after (re-entrant).
- **Nodes** are handed out as :class:`Unified16NodeRef`: SGLang's node object with kvpool's
  ``node_id``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kvpool.sglang.loader import UNIFIED16_MARKER, SGLangModules

CACHE = "sglang.srt.mem_cache.unified_radix_cache"
COMPONENTS = "sglang.srt.mem_cache.unified_cache_components"
_PARAMS = "sglang.srt.mem_cache.cache_init_params"
_MINTING = ("insert", "match_prefix", "cache_finished_req", "cache_unfinished_req", "reset")


def has_unified16_cache(modules: SGLangModules) -> bool:
    """Whether ``modules`` is a release with 0.5.16's unified cache (its component files, and
    no 0.5.23 tree-core registry)."""
    from kvpool.sglang.tree_core import has_unified_cache

    folder = UNIFIED16_MARKER.rpartition("/")[0] + "/"
    return UNIFIED16_MARKER in modules.source.names(folder) and not has_unified_cache(modules)


class Unified16NodeRef:
    """SGLang's tree node ``node`` with kvpool's number for it (``node_id``)."""

    __slots__ = ("cache", "node")

    def __init__(self, node: Any, cache: Unified16Base) -> None:
        self.node = node
        self.cache = cache

    @property
    def node_id(self) -> int:
        return self.cache.snapshot_id(int(self.node.id))

    def __repr__(self) -> str:
        return f"Unified16NodeRef({self.node_id})"


def raw_node(node: Any) -> Any:
    """SGLang's node object behind ``node`` (a :class:`Unified16NodeRef` or the node itself)."""
    return node.node if isinstance(node, Unified16NodeRef) else node


class Unified16Base:
    """The shared part of the 0.5.16 unified-cache adapters (module docstring). A subclass calls
    :meth:`_build` from its constructor; ``impl`` is SGLang's object."""

    modules: Any
    impl: Any

    def _build(self, modules: Any, components: tuple[str, ...], **params: Any) -> None:
        """Build SGLang's cache with ``components`` (``("full", "swa")``...) and ``params``
        (the other ``CacheInitParams`` fields)."""
        self.modules = modules
        self.component_type = modules.attr(COMPONENTS, "ComponentType")
        self._node_cls = modules.attr(CACHE, "UnifiedTreeNode")
        self._next_id = 0
        self._depth = 0
        init = modules.attr(_PARAMS, "CacheInitParams")(
            tree_components=tuple(getattr(self.component_type, c.upper()) for c in components),
            **params,
        )
        with self._call():
            self.impl = modules.attr(CACHE, "UnifiedRadixCache")(init)
        self._after_reset()
        for name in _MINTING:
            setattr(self.impl, name, self._counting(getattr(self.impl, name)))

    def _after_reset(self) -> None:
        """Numbering restarts: the next node minted is kvpool's 1."""
        self._first_id = self._next_id
        self._root_id = int(self.impl.root_node.id)

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """One SGLang call with this cache's node counter (re-entrant)."""
        self._depth += 1
        if self._depth == 1:
            self._node_cls.counter = self._next_id
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._next_id = self._node_cls.counter

    def _counting(self, method: Any) -> Any:
        """SGLang's bound ``method`` run inside :meth:`_call`."""

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._call():
                return method(*args, **kwargs)

        return call

    def snapshot_id(self, raw: int) -> int:
        """kvpool's number of SGLang's node id ``raw`` (module docstring)."""
        if raw == self._root_id:
            return 0
        return raw - self._first_id + 1

    def node_ref(self, node: Any) -> Unified16NodeRef:
        """SGLang's ``node`` as a :class:`Unified16NodeRef` of this cache."""
        return node if isinstance(node, Unified16NodeRef) else Unified16NodeRef(node, self)

    def python_nodes(self) -> list[tuple[Any, list[Any]]]:
        """The tree: ``(node, children in id order)``, breadth-first from the root."""
        out: list[tuple[Any, list[Any]]] = []
        queue = [self.impl.root_node]
        while queue:
            node = queue.pop(0)
            children = sorted(node.children.values(), key=lambda n: int(n.id))
            queue.extend(children)
            out.append((node, children))
        return out


__all__ = ["CACHE", "COMPONENTS", "Unified16Base", "Unified16NodeRef",
           "has_unified16_cache", "raw_node"]  # fmt: skip

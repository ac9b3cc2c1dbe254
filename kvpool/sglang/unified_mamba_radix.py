"""SGLang 0.5.23's ``UnifiedRadixCache`` with the FULL and MAMBA components behind the interface
of kvpool's :class:`~kvpool.reference.unified.mamba_radix_cache.UnifiedMambaRadixCache` (the
Mamba radix cache's: :mod:`kvpool.sglang.mamba_radix` is the 0.5.16 adapter).

:class:`SGLangUnifiedMambaRadixCache` builds SGLang's own cache from
``CacheInitParams(tree_components=(FULL, MAMBA), tree_core_backend=CORE)`` over SGLang's
``HybridReqToTokenPool`` and token allocator (the adapters' ``impl``; page size 1, no extra
buffer), over either tree core (``"rust"``, SGLang's default, or ``"python"``). What the adapter
does so that its results and snapshot compare with kvpool's:

- **Runtime context.** The MAMBA component (and the Rust core's adapter) read three server
  settings from ``sglang.srt.runtime_context``, which the loader stubs;
  :func:`install_mamba_runtime` gives them what a CPU-only single-process server of page
  size 1 answers with its defaults:
  ``get_exec().mamba`` with ``mamba_max_states_per_path = -1`` (no cap per path) and
  ``enable_mamba_extra_buffer_lazy = False`` (strategy ``no_buffer``),
  ``mamba_cache_chunk_size() = 64`` (FLA's chunk, the model giving none, above the page size)
  and ``mamba_checkpoint_grid(page) = lcm(64, page)``. Only the branching length of a match
  (``mamba_branching_seqlen``, which kvpool does not model) reads the last two.
- **Nodes are ids** (:class:`UnifiedNodeRef`, an int that also answers kvpool's ``node_id``); a
  lock returns a receipt that its unlock must hand back (kept per node, last in first out, as
  :mod:`kvpool.sglang.unified_radix` does). Snapshot ids are renumbered as kvpool numbers nodes
  (the root 0, the first node minted after a reset 1).
- **Every insert carries the state** (``InsertParams.mamba_value``, a one-slot tensor); the
  tree frees the caller's duplicate KV slots itself (``value[prev_prefix_len:cached]``).
- **Requests.** ``match_prefix(key, req, cow_mamba)`` passes a :class:`UnifiedMambaReqProxy`
  (:class:`~kvpool.sglang.hybrid.MambaReqProxy` without a streaming session), so the slot
  SGLang's copy-on-write gives the request and the copy it records land on the kvpool request
  as ints.
- **Evictions** are SGLang's ``evict(EvictParams(num_tokens, mamba_num))``; ``evict_full`` and
  ``evict_mamba`` are that call with one of the two amounts.

**What the snapshot can read.** The Python core keeps Python nodes: keys, values, both lock
counts and the state LRU order are read from them (it keeps no KV order: the unified tree evicts
KV leaves by its policy's heap of access times, which the snapshot does not report). The Rust
core exposes node data only through its binding: ids and the KV lock (``full_lock``) from
``pretty_print``, parents from ``collect_path_info``, the KV value from
``get_component_device_value(node, FULL)`` and the state slot from
``get_component_device_value(node, MAMBA)``, the four sizes from its size queries. It does not
expose a node's token ids (the adapter records the token each slot was inserted with, as the
FULL adapter does), its Mamba lock count (the snapshot gives the number of the adapter's open
receipts anchored at the node, SGLang's own temporary locks included: a MAMBA lock counts its
anchor node only; the Rust core's own Mamba sizes are read, so a count that disagrees with them
fails ``INV-UMAMBA-TREE-LOCKS``), nor its LRU orders (empty). The ``unified_mamba_radix_cache``
machine compares trees without LRU orders
(:func:`kvpool.testing.machines.unified_mamba.coarse_mamba_tree`).
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import Any

from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.hybrid import MambaReqProxy
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.radix import to_sglang_key
from kvpool.sglang.tree_core import load_unified
from kvpool.sglang.unified_base import BASE as _BASE
from kvpool.sglang.unified_base import UnifiedNodeRef, UnifiedTreeBase
from kvpool.sglang.unified_sizes import MambaTreeSizes
from kvpool.snapshot import MambaNodeSnapshot, MambaTreeSnapshot

_MAMBA = "sglang.srt.mem_cache.unified_cache.components.mamba"
_RUST_ADAPTER = "sglang.srt.mem_cache.rust_tree_core.adapter"

CHUNK_SIZE = 64
"""``mamba_cache_chunk_size()`` of a page-size-1 server whose model names no chunk size (FLA's
``CHUNK_SIZE``)."""

MAMBA_EXEC = types.SimpleNamespace(
    mamba_max_states_per_path=-1, enable_mamba_extra_buffer_lazy=False, mamba_track_interval=256
)
"""The ``get_exec().mamba`` settings the unified cache reads, at their server defaults."""


class _ExecBag:
    """``get_exec()`` as the MAMBA component reads it (only ``.mamba``)."""

    mamba = MAMBA_EXEC


def _checkpoint_grid(tree_page: int) -> int:
    return math.lcm(CHUNK_SIZE, tree_page)


def install_mamba_runtime(modules: SGLangModules) -> None:
    """Give the MAMBA component and the Rust core's adapter the runtime settings of a CPU-only
    single-process server (see the module docstring); idempotent. Loads the unified cache first:
    the Rust core's adapter module binds the compiled extension when it is imported."""
    load_unified(modules)
    for name in (_MAMBA, _RUST_ADAPTER):
        space = modules.module(name).__dict__
        space["get_exec"] = _ExecBag
        space["mamba_cache_chunk_size"] = lambda: CHUNK_SIZE
        if "mamba_checkpoint_grid" in space:
            space["mamba_checkpoint_grid"] = _checkpoint_grid


@dataclass(frozen=True)
class SGLangUnifiedMambaMatch:
    """``match_prefix``'s result as kvpool's: the slots of the prefix up to the deepest node with
    a state, that node, whether a copy was staged, and SGLang's own ``MatchResult``."""

    device_indices: list[int]
    last_device_node: UnifiedNodeRef
    cow_staged: bool
    result: Any


class UnifiedMambaReqProxy(MambaReqProxy):
    """A kvpool hybrid request as 0.5.23's unified cache reads it: the Mamba fields of
    :class:`~kvpool.sglang.hybrid.MambaReqProxy`, and no streaming session (``session``
    None: the cache's session shortcut does not apply)."""

    @property
    def session(self) -> None:
        return None


def _impl(component: Any) -> Any:
    return getattr(component, "impl", component)


class SGLangUnifiedMambaRadixCache(UnifiedTreeBase, MambaTreeSizes):
    """SGLang 0.5.23's ``UnifiedRadixCache`` (FULL, MAMBA) over ``tree_core`` (see the module
    docstring). ``impl`` is SGLang's object."""

    def __init__(
        self,
        modules: SGLangModules,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int = 1,
        tree_core: str = "rust",
    ) -> None:
        self.page_size = page_size
        install_mamba_runtime(modules)
        self._build(
            modules,
            tree_core,
            ("full", "mamba"),
            disable=False,
            req_to_token_pool=_impl(req_to_token_pool),
            token_to_kv_pool_allocator=_impl(token_to_kv_pool_allocator),
            page_size=page_size,
        )
        self._mamba = self._unified.component_type.MAMBA

    @property
    def root_node(self) -> UnifiedNodeRef:
        return self.node_ref(self._root_id)

    def node_by_id(self, node_id: int) -> UnifiedNodeRef:
        """The node kvpool's snapshot numbers ``node_id``."""
        for row in self.snapshot().nodes:
            if row.node_id == node_id:
                return self.node_ref(self.raw_id(node_id))
        raise KeyError(node_id)

    def _key(self, key: Any) -> Any:
        return to_sglang_key(self.modules, key)

    # ------------------------------------------------------------------ operations
    def match_prefix(
        self, key: Any, req: Any = None, cow_mamba: bool = False
    ) -> SGLangUnifiedMambaMatch:
        """SGLang's ``match_prefix`` (with ``req`` and ``cow_mamba``); the node is the deepest
        one with a state (SGLang's ``last_device_node``)."""
        proxy = None if req is None else UnifiedMambaReqProxy(req)
        params = self.modules.attr(_BASE, "MatchPrefixParams")(
            key=self._key(key), cow_mamba=cow_mamba, req=proxy
        )
        with self._call():
            result = self.impl.match_prefix(params)
            node = self.node_ref(result.last_device_node)
            indices = [int(s) for s in self.impl.path_device_indices(int(node)).tolist()]
        state = self.impl.tree_core.get_component_device_value(int(node), self._mamba)
        staged = bool(cow_mamba and req is not None and state is not None
                      and req.mamba_cow_src_index is not None)  # fmt: skip
        return SGLangUnifiedMambaMatch(indices, node, staged, result)

    frees_duplicates = True
    """An insert frees the caller's duplicate KV slots itself (``prev_prefix_len`` onwards)."""

    def insert(
        self, key: Any, value: Any, mamba_value: int, prev_prefix_len: int = 0
    ) -> tuple[int, bool]:
        """SGLang's ``insert``: ``(tokens already cached, whether the end node had a state)``;
        SGLang frees ``value[prev_prefix_len:cached]``."""
        sg_key = self._key(key)
        params = self.modules.attr(_BASE, "InsertParams")(
            key=sg_key,
            value=as_index_tensor(value),
            mamba_value=as_index_tensor([int(mamba_value)]),
            prev_prefix_len=prev_prefix_len,
        )
        with self._call():
            result = self.impl.insert(params)
        return int(result.prefix_len), bool(result.mamba_exist)

    def inc_lock_ref(self, node: Any) -> None:
        """Lock ``node`` (its path's KV, its own state); the receipt is kept for the unlock."""
        with self._call():
            self.impl.inc_lock_ref(int(node))

    def dec_lock_ref(self, node: Any) -> None:
        """Unlock ``node`` with the receipt of its newest open lock."""
        with self._call():
            self.impl.dec_lock_ref(int(node), self.newest_receipt(node))

    def reset(self) -> None:
        """SGLang's ``reset``; open lock receipts are dropped with the tree."""
        with self._call():
            self.impl.reset()
        self._after_reset()

    # ------------------------------------------------------------------ snapshot
    def snapshot(self) -> MambaTreeSnapshot:
        """kvpool's snapshot (see the module docstring for what each core exposes): nodes
        breadth-first, children in id order; the state LRU order on the Python core only."""
        rows, full_lru, mamba_lru = (
            self._python_rows() if self.tree_core == "python" else self._rust_rows()
        )
        return MambaTreeSnapshot(
            full_evictable_size=self.full_evictable_size(),
            mamba_evictable_size=self.mamba_evictable_size(),
            full_protected_size=self.full_protected_size(),
            mamba_protected_size=self.mamba_protected_size(),
            nodes=tuple(rows),
            full_lru=full_lru,
            mamba_lru=mamba_lru,
        )

    def _state(self, value: Any) -> int | None:
        return None if value is None else int(value.reshape(-1)[0])

    def _python_lru(self, kind: Any) -> tuple[int, ...]:
        lru = self.impl.tree_core.lru_lists[kind]
        pt, ids, node = lru._pt, [], lru.head.lru_next[lru._pt]
        while node is not None and node is not lru.tail:
            ids.append(self.snapshot_id(int(node.id)))
            node = node.lru_next[pt]
        return tuple(ids)

    def _python_rows(self) -> tuple[list[MambaNodeSnapshot], tuple[int, ...], tuple[int, ...]]:
        sid, full, mamba = self.snapshot_id, int(self._full), int(self._mamba)
        rows: list[MambaNodeSnapshot] = []
        for node, kids in self.python_nodes():
            kv, state = node.component_data[full], node.component_data[mamba]
            rows.append(MambaNodeSnapshot(
                node_id=sid(int(node.id)),
                parent_id=None if node.parent is None else sid(int(node.parent.id)),
                key=() if node.key is None else tuple(int(t) for t in node.key.raw_token_ids()),
                extra_key=None if node.key is None else node.key.extra_key,
                value=() if kv.value is None else tuple(int(v) for v in list(kv.value)),
                mamba_value=self._state(state.value),
                full_lock_ref=int(kv.lock_ref),
                mamba_lock_ref=int(state.lock_ref),
                child_ids=tuple(sid(int(c.id)) for c in kids),
            ))  # fmt: skip
        return rows, (), self._python_lru(self._mamba)

    def _rust_rows(self) -> tuple[list[MambaNodeSnapshot], tuple[int, ...], tuple[int, ...]]:
        core, sid = self.impl.tree_core, self.snapshot_id
        rows: list[MambaNodeSnapshot] = []
        for n in self.rust_nodes():
            token = [self.slot_token(v) for v in n.value]
            root = n.parent is None
            rows.append(MambaNodeSnapshot(
                node_id=sid(n.raw),
                parent_id=None if n.parent is None else sid(n.parent),
                key=tuple(t for t, _ in token),
                extra_key=token[0][1] if token else None,
                value=n.value,
                mamba_value=None if root else self._state(
                    core.get_component_device_value(n.raw, self._mamba)),
                full_lock_ref=n.full_lock,
                mamba_lock_ref=1 if root else self.open_locks(n.raw),
                child_ids=tuple(sid(k) for k in n.children),
            ))  # fmt: skip
        return rows, (), ()


__all__ = [
    "CHUNK_SIZE",
    "MAMBA_EXEC",
    "SGLangUnifiedMambaMatch",
    "SGLangUnifiedMambaRadixCache",
    "UnifiedMambaReqProxy",
    "install_mamba_runtime",
]

"""SGLang 0.5.16's ``UnifiedRadixCache`` with the FULL and MAMBA components behind the interface
of kvpool's :class:`~kvpool.reference.unified.mamba_radix_cache.UnifiedMambaRadixCache` (what
the ``unified_mamba_radix_cache`` machine calls; the 0.5.23 adapter is
:mod:`kvpool.sglang.unified_mamba_radix`, 0.5.16's own ``MambaRadixCache`` adapter
:mod:`kvpool.sglang.mamba_radix`).

:class:`SGLangUnified16MambaRadixCache` builds SGLang's own cache from
``CacheInitParams(tree_components=(FULL, MAMBA))`` over SGLang's ``HybridReqToTokenPool`` and
token allocator (the adapters' ``impl``; page size 1, no extra buffer). Nodes are numbered as
:mod:`kvpool.sglang.unified16_base` says. What else the adapter does:

- **Server settings.** The MAMBA component reads ``get_server_args().mamba_cache_chunk_size``
  (only for the branching length of a match that ends below its deepest state, which kvpool
  does not model); :func:`install_mamba16_runtime` answers it with the chunk size of a
  page-size-1 server whose model names none (:data:`~kvpool.sglang.unified_mamba_radix.
  CHUNK_SIZE`, as the 0.5.23 adapter does).
- **Locks.** ``inc_lock_ref`` returns SGLang's ``IncLockRefResult`` (a lock on a tombstone
  records the node in ``skip_lock_node_ids``); the adapter keeps it per node, last in first
  out, and an unlock hands the newest back (``to_dec_params()``), as SGLang's own temporary
  locks do.
- **Requests.** ``match_prefix(key, req, cow_mamba)`` passes a
  :class:`~kvpool.sglang.unified_mamba_radix.UnifiedMambaReqProxy`, so the slot SGLang's
  copy-on-write gives the request and the copy it records land on the kvpool request as ints.
- **Every insert carries the state** (``InsertParams.mamba_value``, a one-slot tensor); the
  tree frees the caller's duplicate KV slots itself (``value[prev_prefix_len:cached]``).
- **Snapshot.** Keys, KV values, states and both lock counts are read from SGLang's nodes; the
  state LRU order from its list (the KV order is none: SGLang evicts KV leaves by its policy's
  heap of access times). The sizes are SGLang's four ledgers.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.radix import to_sglang_key
from kvpool.sglang.unified16_base import COMPONENTS, Unified16Base, Unified16NodeRef, raw_node
from kvpool.sglang.unified_base import BASE
from kvpool.sglang.unified_mamba_radix import CHUNK_SIZE, UnifiedMambaReqProxy
from kvpool.sglang.unified_sizes import MambaTreeSizes
from kvpool.snapshot import MambaNodeSnapshot, MambaTreeSnapshot

_MAMBA = f"{COMPONENTS}.mamba_component"


def _server_args() -> types.SimpleNamespace:
    """``get_server_args()`` as the MAMBA component reads it (only the chunk size)."""
    return types.SimpleNamespace(mamba_cache_chunk_size=CHUNK_SIZE)


def install_mamba16_runtime(modules: SGLangModules) -> None:
    """Give 0.5.16's MAMBA component the server setting it reads (module docstring);
    idempotent, and local to that module (nothing else of the release sees it)."""
    modules.module(_MAMBA).__dict__["get_server_args"] = _server_args


@dataclass(frozen=True)
class Unified16MambaMatch:
    """``match_prefix``'s result as kvpool's: the slots of the prefix up to the deepest node with
    a state, that node, whether a copy was staged, and SGLang's own ``MatchResult``."""

    device_indices: list[int]
    last_device_node: Unified16NodeRef
    cow_staged: bool
    result: Any


def _impl(component: Any) -> Any:
    return getattr(component, "impl", component)


class SGLangUnified16MambaRadixCache(Unified16Base, MambaTreeSizes):
    """SGLang 0.5.16's ``UnifiedRadixCache`` with the FULL and MAMBA components (module
    docstring). ``impl`` is SGLang's object."""

    frees_duplicates = True
    """An insert frees the caller's duplicate KV slots itself (``prev_prefix_len`` onwards)."""

    def __init__(
        self,
        modules: SGLangModules,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int = 1,
        is_eagle: bool = False,
    ) -> None:
        self.page_size = page_size
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self._receipts: dict[int, list[Any]] = {}
        """SGLang's node id -> the ``IncLockRefResult`` of each open lock, oldest first."""
        install_mamba16_runtime(modules)
        self._build(
            modules,
            ("full", "mamba"),
            disable=False,
            req_to_token_pool=_impl(req_to_token_pool),
            token_to_kv_pool_allocator=_impl(token_to_kv_pool_allocator),
            page_size=page_size,
            is_eagle=is_eagle,
        )
        self._full = self.component_type.FULL
        self._mamba = self.component_type.MAMBA

    @property
    def root_node(self) -> Unified16NodeRef:
        return self.node_ref(self.impl.root_node)

    def node_by_id(self, node_id: int) -> Unified16NodeRef:
        """The node kvpool's snapshot numbers ``node_id``; KeyError if none."""
        for node, _ in self.python_nodes():
            if self.snapshot_id(int(node.id)) == node_id:
                return self.node_ref(node)
        raise KeyError(node_id)

    def _key(self, key: Any) -> Any:
        return to_sglang_key(self.modules, key)

    def _state(self, node: Any) -> int | None:
        value = node.component_data[int(self._mamba)].value
        return None if value is None else int(value.reshape(-1)[0])

    # ------------------------------------------------------------------ operations
    def match_prefix(
        self, key: Any, req: Any = None, cow_mamba: bool = False
    ) -> Unified16MambaMatch:
        """SGLang's ``match_prefix`` (with ``req`` and ``cow_mamba``); the node is the deepest
        one with a state (SGLang's ``last_device_node``)."""
        proxy = None if req is None else UnifiedMambaReqProxy(req)
        params = self.modules.attr(BASE, "MatchPrefixParams")(
            key=self._key(key), cow_mamba=cow_mamba, req=proxy
        )
        with self._call():
            result = self.impl.match_prefix(params)
        node = self.node_ref(result.last_device_node)
        indices = [int(s) for s in result.device_indices.tolist()]
        staged = bool(cow_mamba and req is not None and self._state(node.node) is not None
                      and req.mamba_cow_src_index is not None)  # fmt: skip
        return Unified16MambaMatch(indices, node, staged, result)

    def insert(
        self, key: Any, value: Any, mamba_value: int, prev_prefix_len: int = 0
    ) -> tuple[int, bool]:
        """SGLang's ``insert``: ``(tokens already cached, whether the end node had a state)``;
        SGLang frees ``value[prev_prefix_len:cached]``."""
        params = self.modules.attr(BASE, "InsertParams")(
            key=self._key(key),
            value=as_index_tensor(value),
            mamba_value=as_index_tensor([int(mamba_value)]),
            prev_prefix_len=prev_prefix_len,
        )
        with self._call():
            result = self.impl.insert(params)
        return int(result.prefix_len), bool(result.mamba_exist)

    def inc_lock_ref(self, node: Any) -> None:
        """Lock ``node`` (its path's KV, its own state unless it is a tombstone); the receipt
        is kept for the unlock."""
        raw = raw_node(node)
        with self._call():
            receipt = self.impl.inc_lock_ref(raw)
        self._receipts.setdefault(int(raw.id), []).append(receipt)

    def dec_lock_ref(self, node: Any) -> None:
        """Unlock ``node`` with the receipt of its newest open lock (none open: SGLang's unlock
        without a receipt)."""
        raw = raw_node(node)
        held = self._receipts.get(int(raw.id))
        params = held.pop().to_dec_params() if held else None
        with self._call():
            self.impl.dec_lock_ref(raw, params)

    def reset(self) -> None:
        """SGLang's ``reset``; kvpool's node ids restart, open receipts go with the tree."""
        with self._call():
            self.impl.reset()
        self._after_reset()
        self._receipts.clear()

    # ------------------------------------------------------------------ snapshot
    def _mamba_lru(self) -> tuple[int, ...]:
        """The state LRU order, most recent first."""
        lru = self.impl.lru_lists[self._mamba]
        pt, ids, node = lru._pt, [], lru.head.lru_next[lru._pt]
        while node is not None and node is not lru.tail:
            ids.append(self.snapshot_id(int(node.id)))
            node = node.lru_next[pt]
        return tuple(ids)

    def snapshot(self) -> MambaTreeSnapshot:
        """kvpool's snapshot (module docstring): nodes breadth-first, children in id order."""
        sid, full, mamba = self.snapshot_id, int(self._full), int(self._mamba)
        rows: list[MambaNodeSnapshot] = []
        for node, kids in self.python_nodes():
            kv, state = node.component_data[full], node.component_data[mamba]
            root = node.parent is None
            rows.append(MambaNodeSnapshot(
                node_id=sid(int(node.id)),
                parent_id=None if root else sid(int(node.parent.id)),
                key=() if root else tuple(int(t) for t in node.key.raw_token_ids()),
                extra_key=None if root else node.key.extra_key,
                value=() if kv.value is None else tuple(int(v) for v in list(kv.value)),
                mamba_value=self._state(node),
                full_lock_ref=int(kv.lock_ref),
                mamba_lock_ref=int(state.lock_ref),
                child_ids=tuple(sid(int(c.id)) for c in kids),
            ))  # fmt: skip
        return MambaTreeSnapshot(
            full_evictable_size=self.full_evictable_size(),
            mamba_evictable_size=self.mamba_evictable_size(),
            full_protected_size=self.full_protected_size(),
            mamba_protected_size=self.mamba_protected_size(),
            nodes=tuple(rows),
            full_lru=(),
            mamba_lru=self._mamba_lru(),
        )


__all__ = ["SGLangUnified16MambaRadixCache", "Unified16MambaMatch", "install_mamba16_runtime"]

"""SGLang 0.5.23's ``UnifiedRadixCache`` (FULL component) behind kvpool's radix-cache protocol.

:class:`SGLangUnifiedRadixCache` builds SGLang's own ``UnifiedRadixCache`` from
``CacheInitParams(tree_components=(FULL,), tree_core_backend=CORE)`` over the SGLang
``ReqToTokenPool`` and allocator it is given, over either tree core (``"rust"``, SGLang's
default, or ``"python"``; :mod:`kvpool.sglang.tree_core`), and offers the calls of
:class:`~kvpool.sglang.radix.SGLangRadixCache` (its base), so every machine that drives the
legacy tree drives this one. What differs from the legacy adapter:

- **Nodes are ids, locks have receipts, the Rust core keeps no Python nodes**: what every
  unified-cache adapter shares (:mod:`kvpool.sglang.unified_base`: kvpool's numbering of
  SGLang's node ids, ``UnifiedNodeRef``, this cache's node counter, lock receipts, the token each
  slot was inserted with, the Rust core's tree read through its binding).
- **No times, hit counts or priorities.** Neither core's snapshot reports them (the Rust core
  does not expose them): they are 0, and the ``unified_radix_cache`` machine compares trees
  without them (:func:`kvpool.testing.machines.unified.coarse_tree`); an order they decide
  shows in which slots an eviction frees.
- **Children** are reported in id order (the Rust core does not keep insertion order).

Time needs no freezing: the unified cache stamps nodes from its own logical counter
(``get_and_increase_time_counter``), not from the wall clock.
"""

from __future__ import annotations

from typing import Any

import torch

from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.cache_req import CacheReq, InsertedLen
from kvpool.sglang.radix import SGLangMatch, SGLangRadixCache, key_codes, to_sglang_key
from kvpool.sglang.unified_base import BASE, UnifiedNodeRef, UnifiedTreeBase
from kvpool.snapshot import NodeSnapshot, TreeSnapshot


class SGLangUnifiedRadixCache(UnifiedTreeBase, SGLangRadixCache):
    """SGLang's ``UnifiedRadixCache`` with the FULL component (see the module docstring).
    ``impl`` is SGLang's object; ``tree_core`` is ``"rust"`` or ``"python"``."""

    def __init__(
        self,
        modules: Any,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int,
        disable: bool = False,
        eviction_policy: str = "lru",
        tree_core: str = "rust",
        is_eagle: bool = False,
    ) -> None:
        self.page_size = page_size
        self.disable = disable
        self.is_eagle = is_eagle
        self.eviction_policy = eviction_policy.lower()
        self._inserted = InsertedLen()
        self._build(
            modules,
            tree_core,
            ("full",),
            disable=disable,
            req_to_token_pool=getattr(req_to_token_pool, "impl", req_to_token_pool),
            token_to_kv_pool_allocator=getattr(
                token_to_kv_pool_allocator, "impl", token_to_kv_pool_allocator
            ),
            page_size=page_size,
            eviction_policy=eviction_policy,
            is_eagle=is_eagle,
        )
        self._tree_lock = self._lock_of

    def node_ref(self, node: Any) -> UnifiedNodeRef | None:  # type: ignore[override]
        """``node`` (a ``NodeId``) as a node reference; None for a disabled cache (its matches
        name the root, which it never locks: kvpool's chunk cache names no node)."""
        if self.disable or node is None:
            return None
        return super().node_ref(node)

    def _lock_of(self, node: Any) -> Any:
        """SGLang's ``TreeLock`` on ``node`` with the receipt of its newest open lock (the one
        the kvpool request holds: kvpool keeps one lock per request, on ``last_node``)."""
        return self.modules.attr(BASE, "TreeLock")(int(node), self.newest_receipt(node))

    def request(self, req: Any) -> CacheReq:
        """``req`` as SGLang's cache sees it; nodes SGLang stores on it become node refs."""
        return CacheReq(req, self._inserted, self._tree_lock, self.node_ref)

    # ------------------------------------------------------------------ operations
    def match_prefix(self, key: Any) -> SGLangMatch:
        """SGLang's ``match_prefix`` of ``key``; the node is a ``NodeId``."""
        params = self.modules.attr(BASE, "MatchPrefixParams")(key=to_sglang_key(self.modules, key))
        with self._call():
            result = self.impl.match_prefix(params)
            node = self.node_ref(result.last_device_node)
            indices = (
                self.impl.path_device_indices(int(node))
                if node is not None
                else torch.empty((0,), dtype=torch.int64)
            )
        return SGLangMatch(indices, node, result)

    frees_duplicates = True
    """An insert frees the caller's duplicate slots itself (``prev_prefix_len`` onwards)."""

    def insert(
        self, key: Any, value: Any = None, priority: int = 0, prev_prefix_len: int = 0
    ) -> int:
        """SGLang's ``insert``: the length (tokens) that was already cached; SGLang frees
        ``value[prev_prefix_len:cached]``, the duplicates of what the tree held."""
        params = self.modules.attr(BASE, "InsertParams")(
            key=to_sglang_key(self.modules, key),
            value=None if value is None else as_index_tensor(value),
            priority=priority,
            prev_prefix_len=prev_prefix_len,
        )
        with self._call():
            return int(self.impl.insert(params).prefix_len)

    def inc_lock_ref(self, node: Any) -> int:
        """Lock ``node`` (a ``NodeId``; None changes nothing); the change in
        ``evictable_size`` (<= 0). The receipt is kept for the matching unlock."""
        if node is None:
            return 0
        before = int(self.impl.evictable_size())
        with self._call():
            self.impl.inc_lock_ref(int(node))
        return int(self.impl.evictable_size()) - before

    def dec_lock_ref(self, node: Any) -> int:
        """Unlock ``node`` with the receipt of its newest open lock; the change in
        ``evictable_size`` (>= 0)."""
        if node is None:
            return 0
        before = int(self.impl.evictable_size())
        with self._call():
            self.impl.dec_lock_ref(int(node), self.newest_receipt(node))
        return int(self.impl.evictable_size()) - before

    def reset(self) -> None:
        """SGLang's ``reset``; kvpool's numbering restarts, open receipts are dropped."""
        with self._call():
            self.impl.reset()
        self._after_reset()

    def total_size(self) -> int:
        """Tokens the tree holds (the unified cache's ``total_size()`` is ``(full, aux)``)."""
        return int(self.impl.total_size()[0])

    # ------------------------------------------------------------------ snapshot
    def snapshot(self) -> TreeSnapshot:
        """kvpool's tree snapshot (kvpool's node numbering, children in id order, no times,
        hit counts or priorities: see the module docstring)."""
        nodes = () if self.disable else tuple(self._rows())
        return TreeSnapshot(
            page_size=self.page_size,
            disabled=self.disable,
            eviction_policy=self.eviction_policy,
            evictable_size=int(self.impl.evictable_size()),
            protected_size=int(self.impl.protected_size()),
            nodes=nodes,
        )

    def _rows(self) -> list[NodeSnapshot]:
        if self.tree_core == "python":
            return self._python_rows()
        return self._rust_rows()

    def _python_rows(self) -> list[NodeSnapshot]:
        sid = self.snapshot_id
        rows: list[NodeSnapshot] = []
        for node, children in self.python_nodes():
            data = node.component_data[int(self._full)]
            value = () if data.value is None else tuple(int(v) for v in list(data.value))
            key = () if node.key is None else key_codes(node.key)
            rows.append(NodeSnapshot(
                node_id=sid(int(node.id)),
                parent_id=None if node.parent is None else sid(int(node.parent.id)),
                key=key,
                extra_key=None if node.key is None else node.key.extra_key,
                value=value,
                lock_ref=int(data.lock_ref),
                child_ids=tuple(sid(int(c.id)) for c in children),
                child_keys=tuple(key_codes(c.key)[: self.page_size] for c in children),
                last_access_time=0.0,
            ))  # fmt: skip
        return rows

    def _rust_rows(self) -> list[NodeSnapshot]:
        nodes = self.rust_nodes()
        sid = self.snapshot_id
        keys = {n.raw: tuple(self.slot_token(s)[0] for s in n.value) for n in nodes}
        rows: list[NodeSnapshot] = []
        for n in nodes:
            rows.append(NodeSnapshot(
                node_id=sid(n.raw),
                parent_id=None if n.parent is None else sid(n.parent),
                key=keys[n.raw],
                extra_key=self.slot_token(n.value[0])[1] if n.value else None,
                value=n.value,
                lock_ref=n.full_lock,
                child_ids=tuple(sid(k) for k in n.children),
                child_keys=tuple(keys[k][: self.page_size] for k in n.children),
                last_access_time=0.0,
            ))  # fmt: skip
        return rows


__all__ = ["SGLangUnifiedRadixCache"]

"""SGLang 0.5.16's ``UnifiedRadixCache`` with the FULL and SWA components behind the API of
kvpool's SWA radix cache (what the ``unified_swa_radix_cache`` machine calls; the 0.5.23 adapter
is :mod:`kvpool.sglang.unified_swa_radix`).

:class:`SGLangUnified16SWARadixCache` builds SGLang's own cache from
``CacheInitParams(tree_components=(FULL, SWA), sliding_window_size=W)`` over an
:class:`~kvpool.sglang.swa.SGLangSWAAllocator` (SGLang's ``SWATokenToKVPoolAllocator``, which the
SWA component requires). Nodes are numbered as :mod:`kvpool.sglang.unified16_base` says. What
else the adapter does:

- **Locks.** ``inc_lock_ref`` returns SGLang's ``IncLockRefResult``; the adapter reports its
  ``swa_uuid_for_lock`` in kvpool's numbering (SGLang draws uuids from a counter shared by the
  whole process, the first one 2: the adapter numbers them 1, 2, ... per cache in the order they
  first appear; a reset restarts it) and hands an unlock back
  ``DecLockRefParams(swa_uuid_for_lock=uuid)``, the receipt 0.5.16's scheduler builds in
  ``cache_finished_req`` / ``cache_unfinished_req`` (without the lock's
  ``skip_lock_node_ids``). ``dec_swa_lock_only`` is SGLang's own (the scheduler's early window
  release).
- **Snapshot.** ``lock_ref`` and ``swa_lock_ref`` are the FULL and SWA components' counts;
  ``swa_tombstone`` a node without SWA value (never the root); sizes are SGLang's four ledgers.
  Access times, hit counts and priorities are not reported (0): the machine compares the tree
  without them (an order they decide shows in which slots an eviction frees).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.radix import key_codes, to_sglang_key
from kvpool.sglang.unified16_base import Unified16Base, Unified16NodeRef, raw_node
from kvpool.sglang.unified_base import BASE
from kvpool.sglang.unified_sizes import SWATreeSizes
from kvpool.snapshot import NodeSnapshot, TreeSnapshot


@dataclass(frozen=True)
class Unified16SWAMatch:
    """``match_prefix``'s result: the matched full slots (int64 tensor), the node, SGLang's
    ``MatchResult``."""

    device_indices: Any
    last_device_node: Unified16NodeRef
    result: Any


class SGLangUnified16SWARadixCache(Unified16Base, SWATreeSizes):
    """SGLang 0.5.16's ``UnifiedRadixCache`` with the FULL and SWA components (module
    docstring). ``impl`` is SGLang's object."""

    swa_lock_counts_readable = True
    """The snapshot reports per-node SWA lock counts."""

    def __init__(
        self,
        modules: Any,
        allocator: Any,
        page_size: int,
        sliding_window_size: int,
        eviction_policy: str = "lru",
        req_to_token_pool: Any = None,
        is_eagle: bool = False,
    ) -> None:
        """``req_to_token_pool``: SGLang's ``ReqToTokenPool`` (its ``impl``) for the cache's
        ``cache_finished_req`` / ``cache_unfinished_req`` (None: the tree alone)."""
        self.page_size = page_size
        self.sliding_window_size = sliding_window_size
        self.disable = False
        self.allocator = allocator
        self._uuids: dict[int, int] = {}
        """SGLang's SWA uuid -> kvpool's number (1, 2, ... in order of appearance)."""
        self._build(
            modules,
            ("full", "swa"),
            disable=False,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=getattr(allocator, "impl", allocator),
            page_size=page_size,
            eviction_policy=eviction_policy,
            sliding_window_size=sliding_window_size,
            is_eagle=is_eagle,
        )
        self._full = self.component_type.FULL
        self._swa = self.component_type.SWA

    # ------------------------------------------------------------------ uuids
    def _kvpool_uuid(self, uuid: int | None) -> int | None:
        if uuid is None:
            return None
        return self._uuids.setdefault(int(uuid), len(self._uuids) + 1)

    def _raw_uuid(self, uuid: int | None) -> int | None:
        if uuid is None:
            return None
        return next((s for s, k in self._uuids.items() if k == uuid), -1)

    # ------------------------------------------------------------------ operations
    def match_prefix(self, key: Any) -> Unified16SWAMatch:
        """SGLang's ``match_prefix``: the usable prefix's slots and its node."""
        params = self.modules.attr(BASE, "MatchPrefixParams")(key=to_sglang_key(self.modules, key))
        with self._call():
            result = self.impl.match_prefix(params)
        node = self.node_ref(result.last_device_node)
        return Unified16SWAMatch(result.device_indices, node, result)

    def insert(
        self, key: Any, value: Any, prev_prefix_len: int = 0, swa_evicted_seqlen: int = 0
    ) -> int:
        """SGLang's ``insert`` with the request's SWA eviction cursor: the tokens that were
        already cached (SGLang frees the duplicates and recovers tombstones itself)."""
        params = self.modules.attr(BASE, "InsertParams")(
            key=to_sglang_key(self.modules, key),
            value=as_index_tensor(value),
            prev_prefix_len=prev_prefix_len,
            swa_evicted_seqlen=swa_evicted_seqlen,
        )
        with self._call():
            return int(self.impl.insert(params).prefix_len)

    def inc_lock_ref(self, node: Any) -> int | None:
        """Lock ``node``; the kvpool uuid of the node where the SWA lock stopped, or None."""
        with self._call():
            result = self.impl.inc_lock_ref(raw_node(node))
        return self._kvpool_uuid(result.swa_uuid_for_lock)

    def dec_lock_ref(
        self, node: Any, swa_uuid_for_lock: int | None = None, skip_swa: bool = False
    ) -> None:
        """Release a lock (``skip_swa``: its SWA part was released already)."""
        params = self.modules.attr(BASE, "DecLockRefParams")(
            swa_uuid_for_lock=self._raw_uuid(swa_uuid_for_lock)
        )
        with self._call():
            self.impl.dec_lock_ref(raw_node(node), params, skip_swa)

    def dec_swa_lock_only(self, node: Any, swa_uuid_for_lock: int | None = None) -> None:
        """SGLang's early release of a lock's SWA part (the window moved on)."""
        with self._call():
            self.impl.dec_swa_lock_only(raw_node(node), self._raw_uuid(swa_uuid_for_lock))

    def reset(self) -> None:
        """SGLang's ``reset``; kvpool's node ids and uuids restart."""
        with self._call():
            self.impl.reset()
        self._after_reset()
        self._uuids.clear()

    # ------------------------------------------------------------------ snapshot
    def snapshot(self) -> TreeSnapshot:
        """kvpool's tree snapshot (module docstring)."""
        impl, sid, ps = self.impl, self.snapshot_id, self.page_size
        rows: list[NodeSnapshot] = []
        for node, children in self.python_nodes():
            full = node.component_data[int(self._full)]
            swa = node.component_data[int(self._swa)]
            is_root = node.parent is None
            value = () if full.value is None else tuple(int(v) for v in list(full.value))
            rows.append(NodeSnapshot(
                node_id=sid(int(node.id)),
                parent_id=None if is_root else sid(int(node.parent.id)),
                key=() if is_root else key_codes(node.key),
                extra_key=None if is_root else node.key.extra_key,
                value=value,
                lock_ref=int(full.lock_ref),
                child_ids=tuple(sid(int(c.id)) for c in children),
                child_keys=tuple(key_codes(c.key)[:ps] for c in children),
                last_access_time=0.0,
                swa_tombstone=not is_root and swa.value is None,
                swa_lock_ref=int(swa.lock_ref),
            ))  # fmt: skip
        return TreeSnapshot(
            page_size=ps,
            disabled=False,
            eviction_policy="",
            evictable_size=int(impl.full_evictable_size()),
            protected_size=int(impl.full_protected_size()),
            nodes=tuple(rows),
            swa_evictable_size=int(impl.swa_evictable_size()),
            swa_protected_size=int(impl.swa_protected_size()),
        )


__all__ = ["SGLangUnified16SWARadixCache", "Unified16SWAMatch"]

"""SGLang 0.5.23's ``UnifiedRadixCache`` with the FULL and SWA components behind the API of
kvpool's SWA radix cache.

:class:`SGLangUnifiedSWARadixCache` builds SGLang's own ``UnifiedRadixCache`` from
``CacheInitParams(tree_components=(FULL, SWA), sliding_window_size=W, tree_core_backend=CORE)``
over an :class:`~kvpool.sglang.swa.SGLangSWAAllocator` (SGLang's ``SWATokenToKVPoolAllocator``,
which the SWA component requires) and offers the calls the ``swa_radix_cache`` and
``unified_swa_radix_cache`` machines make (those of
:class:`~kvpool.sglang.swa_radix.SGLangSWARadixCache`, 0.5.16's adapter). What the adapter does:

- **Nodes are ids**, handed out as ``UnifiedNodeRef``s and numbered, counted and read from the
  Rust core as every unified-cache adapter does (:mod:`kvpool.sglang.unified_base`).
- **Locks.** SGLang's ``inc_lock_ref`` returns a receipt whose ``component_lock_uuids[SWA]``
  names the node where the SWA window lock stopped (``None``: it reached the root); SGLang
  draws these uuids from a process-wide counter (``1e14 + n``). The adapter reports them in
  kvpool's numbering (1, 2, ... per cache, in the order they first appear; a reset restarts it)
  and rebuilds the receipt ``DecLockRefParams(node, {SWA: uuid})`` from the pair it is handed
  back (two locks on one node with one uuid have equal receipts). ``dec_swa_lock_only`` is
  SGLang's ``release_swa`` of that lock (the scheduler's early window release).
- **Snapshot.** ``lock_ref`` is the FULL lock count; ``swa_tombstone`` a node without SWA value
  (the root never is one); sizes are SGLang's four ledgers. ``swa_lock_ref`` is the SWA
  component's ``lock_ref`` on the Python core. **The Rust core does not expose per-node SWA
  lock counts** (its binding reports full locks through ``pretty_print`` and component values
  through ``get_component_device_value``, nothing else per node): its snapshot reports 0 for
  every node but the root, and :attr:`swa_lock_counts_readable` is False (the
  ``unified_swa_radix_cache`` machine then compares SWA locks through the SWA sizes only).
  Access times, hit counts and priorities are not reported (0), as for the FULL set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.radix import key_codes, to_sglang_key
from kvpool.sglang.unified_base import BASE as _BASE
from kvpool.sglang.unified_base import UnifiedNodeRef, UnifiedTreeBase
from kvpool.sglang.unified_sizes import SWATreeSizes
from kvpool.snapshot import NodeSnapshot, TreeSnapshot


@dataclass(frozen=True)
class UnifiedSWAMatch:
    """``match_prefix``'s result: the matched full slots (int64 tensor), the node, SGLang's
    ``MatchResult``."""

    device_indices: Any
    last_device_node: UnifiedNodeRef
    result: Any


class SGLangUnifiedSWARadixCache(UnifiedTreeBase, SWATreeSizes):
    """SGLang's ``UnifiedRadixCache`` with the FULL and SWA components (see the module
    docstring). ``impl`` is SGLang's object; ``tree_core`` is ``"rust"`` or ``"python"``."""

    def __init__(
        self,
        modules: Any,
        allocator: Any,
        page_size: int,
        sliding_window_size: int,
        eviction_policy: str = "lru",
        tree_core: str = "rust",
        is_eagle: bool = False,
    ) -> None:
        self.page_size = page_size
        self.sliding_window_size = sliding_window_size
        self.disable = False
        self.allocator = allocator
        self._uuids: dict[int, int] = {}
        """SGLang's SWA uuid -> kvpool's number (1, 2, ... in order of appearance)."""
        self._build(
            modules,
            tree_core,
            ("full", "swa"),
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=getattr(allocator, "impl", allocator),
            page_size=page_size,
            eviction_policy=eviction_policy,
            sliding_window_size=sliding_window_size,
            is_eagle=is_eagle,
        )
        self._swa = self._unified.component_type.SWA

    @property
    def swa_lock_counts_readable(self) -> bool:
        """Whether the snapshot reports per-node SWA lock counts (the Python core only)."""
        return self.tree_core == "python"

    # ------------------------------------------------------------------ uuids and receipts
    def _kvpool_uuid(self, uuid: int | None) -> int | None:
        if uuid is None:
            return None
        return self._uuids.setdefault(int(uuid), len(self._uuids) + 1)

    def _receipt(self, node: Any, uuid: int | None) -> Any:
        """The receipt of a lock on ``node`` whose SWA part stopped at kvpool uuid ``uuid``."""
        raw = None
        if uuid is not None:
            raw = next((s for s, k in self._uuids.items() if k == uuid), -1)
        return self.modules.attr(_BASE, "DecLockRefParams")(
            node_id=int(node), component_lock_uuids={self._swa: raw}
        )

    # ------------------------------------------------------------------ operations
    def match_prefix(self, key: Any) -> UnifiedSWAMatch:
        """SGLang's ``match_prefix``: the usable prefix's slots and its node."""
        params = self.modules.attr(_BASE, "MatchPrefixParams")(key=to_sglang_key(self.modules, key))
        with self._call():
            result = self.impl.match_prefix(params)
            node = self.node_ref(result.last_device_node)
            indices = self.impl.path_device_indices(int(node))
        return UnifiedSWAMatch(indices, node, result)

    def insert(
        self, key: Any, value: Any, prev_prefix_len: int = 0, swa_evicted_seqlen: int = 0
    ) -> int:
        """SGLang's ``insert`` with the request's SWA eviction cursor: the tokens that were
        already cached (SGLang frees the duplicates and recovers tombstones itself)."""
        params = self.modules.attr(_BASE, "InsertParams")(
            key=to_sglang_key(self.modules, key),
            value=as_index_tensor(value),
            prev_prefix_len=prev_prefix_len,
        )
        params.set_evicted_seqlen(self._swa, swa_evicted_seqlen)
        with self._call():
            return int(self.impl.insert(params).prefix_len)

    def inc_lock_ref(self, node: Any) -> int | None:
        """Lock ``node``; the kvpool uuid of the node where the SWA lock stopped, or None."""
        with self._call():
            result = self.impl.inc_lock_ref(int(node))
        return self._kvpool_uuid(result.component_lock_uuids.get(self._swa))

    def dec_lock_ref(
        self, node: Any, swa_uuid_for_lock: int | None = None, skip_swa: bool = False
    ) -> None:
        """Release a lock (``skip_swa``: its SWA part was released already)."""
        with self._call():
            self.impl.dec_lock_ref(int(node), self._receipt(node, swa_uuid_for_lock), skip_swa)

    def dec_swa_lock_only(self, node: Any, swa_uuid_for_lock: int | None = None) -> None:
        """SGLang's ``release_swa``: the SWA part of a lock, early (the window moved on)."""
        lock = self.modules.attr(_BASE, "TreeLock")(
            int(node), self._receipt(node, swa_uuid_for_lock)
        )
        with self._call():
            self.impl.release_swa(lock)

    def reset(self) -> None:
        """SGLang's ``reset``; kvpool's node ids and uuids restart."""
        with self._call():
            self.impl.reset()
        self._after_reset()
        self._uuids.clear()

    # ------------------------------------------------------------------ snapshot
    def snapshot(self) -> TreeSnapshot:
        """kvpool's tree snapshot (see the module docstring)."""
        impl = self.impl
        rows = self._python_swa_rows() if self.tree_core == "python" else self._rust_swa_rows()
        return TreeSnapshot(
            page_size=self.page_size,
            disabled=False,
            eviction_policy="",
            evictable_size=int(impl.full_evictable_size()),
            protected_size=int(impl.full_protected_size()),
            nodes=tuple(rows),
            swa_evictable_size=int(impl.swa_evictable_size()),
            swa_protected_size=int(impl.swa_protected_size()),
        )

    def _python_swa_rows(self) -> list[NodeSnapshot]:
        sid = self.snapshot_id
        rows: list[NodeSnapshot] = []
        for node, children in self.python_nodes():
            full = node.component_data[int(self._full)]
            swa = node.component_data[int(self._swa)]
            is_root = node.parent is None
            value = () if full.value is None else tuple(int(v) for v in list(full.value))
            rows.append(NodeSnapshot(
                node_id=sid(int(node.id)),
                parent_id=None if node.parent is None else sid(int(node.parent.id)),
                key=() if is_root else key_codes(node.key),
                extra_key=None if is_root else node.key.extra_key,
                value=value,
                lock_ref=int(full.lock_ref),
                child_ids=tuple(sid(int(c.id)) for c in children),
                child_keys=tuple(key_codes(c.key)[: self.page_size] for c in children),
                last_access_time=0.0,
                swa_tombstone=not is_root and swa.value is None,
                swa_lock_ref=int(swa.lock_ref),
            ))  # fmt: skip
        return rows

    def _rust_swa_rows(self) -> list[NodeSnapshot]:
        core, sid = self.impl.tree_core, self.snapshot_id
        nodes = self.rust_nodes()
        keys = {n.raw: tuple(self.slot_token(v)[0] for v in n.value) for n in nodes}
        rows: list[NodeSnapshot] = []
        for n in nodes:
            root = n.parent is None
            tomb = not root and core.get_component_device_value(n.raw, self._swa) is None
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
                swa_tombstone=tomb,
                swa_lock_ref=1 if root else 0,
            ))  # fmt: skip
        return rows


__all__ = ["SGLangUnifiedSWARadixCache", "UnifiedSWAMatch"]

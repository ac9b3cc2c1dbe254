"""SGLang 0.5.23's ``UnifiedRadixCache`` with the FULL and SWA components behind the API of
kvpool's SWA radix cache.

:class:`SGLangUnifiedSWARadixCache` builds SGLang's own ``UnifiedRadixCache`` from
``CacheInitParams(tree_components=(FULL, SWA), sliding_window_size=W, tree_core_backend=CORE)``
over an :class:`~kvpool.sglang.swa.SGLangSWAAllocator` (SGLang's ``SWATokenToKVPoolAllocator``,
which the SWA component requires) and offers the calls the ``swa_radix_cache`` and
``unified_swa_radix_cache`` machines make (those of
:class:`~kvpool.sglang.swa_radix.SGLangSWARadixCache`, 0.5.16's adapter). What the adapter does:

- **Nodes are ids**, handed out as :class:`SWANodeRef` (an int that also answers ``node_id``),
  renumbered as kvpool numbers them (the root 0, the first node minted after a reset 1) and
  read as :class:`~kvpool.sglang.unified_radix.SGLangUnifiedRadixCache` reads the FULL set:
  the Python core's shared node counter is loaded and saved around each call, the Rust core's
  node data comes from ``pretty_print`` (captured from file descriptor 1),
  ``collect_path_info`` and ``get_component_device_value``, and the token each slot was
  inserted with is recorded (the Rust core cannot report token ids).
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

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvpool.errors import ConfigError
from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.radix import to_sglang_key
from kvpool.sglang.tree_core import TREE_CORES, load_unified
from kvpool.sglang.unified_radix import capture_fd1
from kvpool.snapshot import NodeSnapshot, TreeSnapshot

_BASE = "sglang.srt.mem_cache.base_prefix_cache"
_CORE = "sglang.srt.mem_cache.unified_cache.unified_tree_core"
_LINE = re.compile(r"^( *)\[(\d+)\] (\d+) full_lock=(-?\d+)")


class SWANodeRef(int):
    """A unified-cache ``NodeId`` (an int, as SGLang takes it) that also answers kvpool's
    ``node_id``: the id kvpool's snapshot gives the node."""

    cache: SGLangUnifiedSWARadixCache

    def __new__(cls, raw: int, cache: SGLangUnifiedSWARadixCache) -> SWANodeRef:
        ref = super().__new__(cls, raw)
        ref.cache = cache
        return ref

    @property
    def node_id(self) -> int:
        return self.cache.snapshot_id(int(self))


@dataclass(frozen=True)
class UnifiedSWAMatch:
    """``match_prefix``'s result: the matched full slots (int64 tensor), the node, SGLang's
    ``MatchResult``."""

    device_indices: Any
    last_device_node: SWANodeRef
    result: Any


class SGLangUnifiedSWARadixCache:
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
    ) -> None:
        if tree_core not in TREE_CORES:
            raise ConfigError(f"tree_core must be one of {TREE_CORES}, got {tree_core!r}")
        self.modules = modules
        self.page_size = page_size
        self.sliding_window_size = sliding_window_size
        self.disable = False
        self.tree_core = tree_core
        self.allocator = allocator
        self._unified = load_unified(modules)
        kinds = self._unified.component_type
        self._full, self._swa = kinds.FULL, kinds.SWA
        self._node_cls = modules.attr(_CORE, "UnifiedTreeNode")
        self._next_id = 0
        self._slot_token: dict[int, tuple[int, str | None]] = {}
        self._uuids: dict[int, int] = {}
        """SGLang's SWA uuid -> kvpool's number (1, 2, ... in order of appearance)."""
        params = modules.attr("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=getattr(allocator, "impl", allocator),
            page_size=page_size,
            eviction_policy=eviction_policy,
            tree_components=(self._full, self._swa),
            tree_core_backend=tree_core,
            sliding_window_size=sliding_window_size,
        )
        with self._call():
            self.impl: Any = self._unified.cache_module.UnifiedRadixCache(params)
        self._first_id = self._next_id
        self._root_id = self._root()
        chosen = type(self.impl.tree_core).__name__
        if ("Rust" in chosen) != (tree_core == "rust"):
            raise ConfigError(f"asked for the {tree_core} tree core, SGLang built {chosen}")
        self.impl.insert = self._recording(self.impl.insert)

    def _root(self) -> int:
        return int(self.impl.tree_core.root_node_handle())

    def snapshot_id(self, raw: int) -> int:
        """kvpool's number of SGLang's node ``raw``: the root 0, the first node minted after
        the last reset 1 (the Python core's reset also mints its LRU lists' sentinels)."""
        if raw == self._root_id:
            return 0
        if self.tree_core == "python":
            return raw - self._first_id + 1
        return raw - self._root_id

    def node_ref(self, node: Any) -> SWANodeRef:
        """``node`` (a ``NodeId``) as a :class:`SWANodeRef` of this cache."""
        return node if isinstance(node, SWANodeRef) else SWANodeRef(int(node), self)

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """One SGLang call with this cache's node counter (the Python core's is shared)."""
        self._node_cls.counter = self._next_id
        try:
            yield
        finally:
            self._next_id = self._node_cls.counter

    def _recording(self, method: Any) -> Any:
        """SGLang's bound ``insert`` recording the token each inserted slot stands for."""

        def call(params: Any) -> Any:
            if params.value is not None:
                extra = params.key.extra_key
                for slot, token in zip(params.value.tolist(), params.key.raw_token_ids(),
                                       strict=False):  # fmt: skip
                    self._slot_token[int(slot)] = (int(token), extra)
            return method(params)

        return call

    def pretty_print(self) -> str:
        """What SGLang's ``pretty_print`` prints (the Rust core prints from Rust)."""
        return capture_fd1(self.impl.pretty_print)

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

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]:
        """(full tokens freed, SWA tokens freed)."""
        params = self.modules.attr(_BASE, "EvictParams")(
            num_tokens=num_tokens, swa_num_tokens=swa_num_tokens
        )
        with self._call():
            result = self.impl.evict(params)
        return int(result.num_tokens_evicted), int(result.swa_num_tokens_evicted)

    def full_evictable_size(self) -> int:
        return int(self.impl.full_evictable_size())

    def full_protected_size(self) -> int:
        return int(self.impl.full_protected_size())

    def swa_evictable_size(self) -> int:
        return int(self.impl.swa_evictable_size())

    def swa_protected_size(self) -> int:
        return int(self.impl.swa_protected_size())

    def reset(self) -> None:
        """SGLang's ``reset``; kvpool's node ids and uuids restart."""
        with self._call():
            self.impl.reset()
        self._first_id = self._next_id
        self._root_id = self._root()
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
        root = self.impl.tree_core.root_node
        sid = self.snapshot_id
        rows: list[NodeSnapshot] = []
        queue = [root]
        while queue:
            node = queue.pop(0)
            children = sorted(node.children.values(), key=lambda n: int(n.id))
            queue.extend(children)
            full = node.component_data[int(self._full)]
            swa = node.component_data[int(self._swa)]
            is_root = node is root
            value = () if full.value is None else tuple(int(v) for v in list(full.value))
            rows.append(NodeSnapshot(
                node_id=sid(int(node.id)),
                parent_id=None if node.parent is None else sid(int(node.parent.id)),
                key=() if is_root else tuple(int(t) for t in node.key.raw_token_ids()),
                extra_key=None if is_root else node.key.extra_key,
                value=value,
                lock_ref=int(full.lock_ref),
                child_ids=tuple(sid(int(c.id)) for c in children),
                child_keys=tuple(tuple(int(t) for t in c.key.raw_token_ids()[: self.page_size])
                                 for c in children),
                last_access_time=0.0,
                swa_tombstone=not is_root and swa.value is None,
                swa_lock_ref=int(swa.lock_ref),
            ))  # fmt: skip
        return rows

    def _rust_swa_rows(self) -> list[NodeSnapshot]:
        core = self.impl.tree_core
        lines = [m for m in map(_LINE.match, self.pretty_print().splitlines()) if m]
        if not lines:
            return []
        base = int(lines[0].group(2))
        sid = self.snapshot_id
        locks = {int(m.group(2)): int(m.group(4)) for m in lines}
        ids = list(locks)
        parent: dict[int, int | None] = {base: None}
        for path in core.collect_path_info(ids):
            for info in path:
                parent[int(info.node_id)] = int(info.parent_id)
        children: dict[int, list[int]] = {i: [] for i in ids}
        for node_id in ids:
            up = parent.get(node_id)
            if up is not None:
                children[up].append(node_id)
        values: dict[int, tuple[int, ...]] = {}
        tomb: dict[int, bool] = {}
        for node_id in ids:
            got = core.get_component_device_value(node_id, self._full)
            values[node_id] = () if got is None else tuple(int(v) for v in got.tolist())
            tomb[node_id] = node_id != base and (
                core.get_component_device_value(node_id, self._swa) is None
            )
        keys = {i: tuple(self._slot_token.get(s, (-1, None))[0] for s in values[i]) for i in ids}
        rows: list[NodeSnapshot] = []
        order = [base]
        while order:
            node_id = order.pop(0)
            kids = sorted(children[node_id])
            order.extend(kids)
            up = parent.get(node_id)
            first = values[node_id][0] if values[node_id] else None
            rows.append(NodeSnapshot(
                node_id=sid(node_id),
                parent_id=None if up is None else sid(up),
                key=keys[node_id],
                extra_key=None if first is None else self._slot_token.get(first, (-1, None))[1],
                value=values[node_id],
                lock_ref=locks[node_id],
                child_ids=tuple(sid(k) for k in kids),
                child_keys=tuple(keys[k][: self.page_size] for k in kids),
                last_access_time=0.0,
                swa_tombstone=tomb[node_id],
                swa_lock_ref=1 if node_id == base else 0,
            ))  # fmt: skip
        return rows


__all__ = ["SGLangUnifiedSWARadixCache", "UnifiedSWAMatch"]

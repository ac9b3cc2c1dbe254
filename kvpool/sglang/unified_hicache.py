"""SGLang 0.5.23's ``UnifiedRadixCache`` (FULL component) with its host tier, on the CPU, behind
the interface of kvpool's ``HiRadixCache`` (so the ``hiradix_cache`` machine drives it).

SGLang 0.5.23 has no ``HiRadixCache``: ``UnifiedRadixCache.init_hicache`` attaches a host pool
group and a ``HybridCacheController`` to the unified tree (specs/unified_cache.md, "The host
tier inside the unified cache"). :class:`SGLangUnifiedHiCache` runs SGLang's own tree code over
either tree core: ``insert`` (write-through backups issued as ``BackupKV`` actions),
``match_prefix`` (host hits), ``evict`` (demotion to host, write-back backups), ``evict_host``,
``init_load_back`` / ``load_back``, ``writing_check``, ``loading_check``, the locks and ``reset``.
What is not SGLang's, and why it does not change what is compared:

- **Attaching the host tier.** ``init_hicache`` reads server arguments and builds the host
  buffers and the controller (CUDA streams, threads) through the pool assembler; the adapter
  sets what it sets for one rank in cache mode (storage: :mod:`kvpool.sglang.unified_storage`):
  the controller, the host
  pool group, the FULL component's host pool, ``set_hicache_enabled`` on the tree core, the
  write-through threshold (1 for ``write_through``, 2 otherwise), ``is_write_back`` and the
  load-back threshold (``init_hicache`` hard-codes 10; the adapter takes the machine's), then
  resets the cache (as ``init_hicache``'s caller does before serving).
- **Controller** (:class:`~kvpool.sglang.unified_controller.UnifiedController`): SGLang's
  controller contract restated on kvpool's twin controller: ``write(..., flush=False)``
  reserves host slots at once and queues the copy; ``start_writing`` merges the queue into one
  acknowledgement; ``load`` reserves device slots and queues; ``start_loading`` merges into one
  acknowledgement. An acknowledgement's
  ``finish_event`` is a stand-in that is done when the harness says or when SGLang waits on
  it (``synchronize``); finishing copies the content (tags).
- **Host pool group**: SGLang's ``HostKVCache`` allocator (:class:`~kvpool.sglang.host_pool.
  SGLangHostPool`) with tags beside it, behind the three calls the cache makes of the group
  (``alloc``, ``free``, ``available_size``) and the anchor entry's two fields it reads.
- **Acknowledgements** arrive as ``check_hicache_events`` delivers them: ``writing_check(k)``
  flushes the queued writes (``flush_pending_backups``) and then finishes the first ``k``;
  ``loading_check(k)`` finishes the first ``k`` loads.
- **Reading the tree**: the Python core's nodes directly; on the Rust core, whose binding
  reports no host slots, a host-only node's host slots come from ``build_load_back_spec``
  (read-only) and a device node's backup from the device-to-host slot map of the writes and
  loads the adapter saw, and, for a node an insert restored from host (or a split's part of
  one), from the host slots its path tokens had before the insert (see
  :meth:`SGLangUnifiedHiCache.snapshot`).

``implementation("0.5.23")`` offers this adapter as ``hiradix_cache``: ``kvpool verify --sglang
0.5.23 --component hiradix_cache`` compares it with kvpool's ``HiRadixCache`` under
``Rules.hicache_host_tier == "unified"`` (specs/unified_cache.md).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.optimized.hicache.tree_view import device_row_tags
from kvpool.reference.hicache.memory_pool_host import host_pool_size
from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.cache_req import InsertedLen
from kvpool.sglang.hiradix import _TaggedHostPool
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.radix import key_codes, to_sglang_key
from kvpool.sglang.unified_base import BASE, UnifiedNodeRef, UnifiedTreeBase
from kvpool.sglang.unified_controller import HostGroup, UnifiedController
from kvpool.sglang.unified_storage import StorageController, UnifiedStorage, install_page_names
from kvpool.snapshot import AllocatorSnapshot, HostTierSnapshot, NodeSnapshot, TreeSnapshot


@dataclass(frozen=True)
class UnifiedHiMatch:
    """``match_prefix``'s result as kvpool's ``MatchResult`` names it."""

    device_indices: torch.Tensor
    last_device_node: UnifiedNodeRef
    last_host_node: UnifiedNodeRef
    host_hit_length: int


class _LoadReq:
    """The request fields ``init_load_back`` reads (a request without a Mamba slot)."""

    def __init__(self, last_node: int) -> None:
        self.rid = "kvpool-load-back"
        self.last_node = last_node
        self.swa_host_hit_length = 0
        self.mamba_host_hit_length = 0
        self.kv = self
        self.mamba_pool_idx = None


class SGLangUnifiedHiCache(UnifiedTreeBase):
    """SGLang's ``UnifiedRadixCache`` (FULL) with the host tier attached (see the module
    docstring). ``impl`` is SGLang's object; ``tree_core`` is ``"rust"`` or ``"python"``."""

    frees_duplicates = True
    """An insert frees the caller's duplicate device slots itself."""

    def __init__(self, modules: SGLangModules, req_to_token_pool: Any, allocator: Any,
                 page_size: int, device_pool: Any, host_to_device_ratio: float,
                 eviction_policy: str = "lru", write_policy: str = "write_through",
                 load_back_threshold: int = 10, tree_core: str = "rust",
                 prefetch_threshold: int = 256, enable_storage: bool = False,
                 is_eagle: bool = False) -> None:  # fmt: skip
        self.page_size = page_size
        self.disable = False
        self.is_eagle = is_eagle
        self.eviction_policy = eviction_policy.lower()
        self.write_policy = write_policy
        self.allocator = allocator
        self._inserted = InsertedLen()
        """0.5.23's ``req.kv.cache_inserted_len`` per request (the glue manager's requests)."""
        # no byte budget (host size 0): the host pool is the device pool's size times the
        # ratio, whatever a token's bytes (MHA, MLA or a quantized layout)
        size = host_pool_size(device_pool.size, 1, host_to_device_ratio, 0, page_size)
        self.token_to_kv_pool_host = _TaggedHostPool(modules, device_pool, size, page_size)
        group = HostGroup(self.token_to_kv_pool_host)
        self.storage: UnifiedStorage | None = None
        """Storage prefetches (kvpool.sglang.unified_storage), when the configuration asks."""
        self.cache_controller: UnifiedController
        if enable_storage:
            self.cache_controller = StorageController(allocator, group, page_size, write_policy)
        else:
            self.cache_controller = UnifiedController(allocator, group, page_size, write_policy)
        self._build(
            modules,
            tree_core,
            ("full",),
            disable=False,
            req_to_token_pool=getattr(req_to_token_pool, "impl", req_to_token_pool),
            token_to_kv_pool_allocator=getattr(allocator, "impl", allocator),
            page_size=page_size,
            eviction_policy=eviction_policy,
            is_eagle=is_eagle,
        )
        self.cache_controller.token_of = self.slot_token
        self.cache_controller.loaded_token = self._slot_token.__setitem__
        impl = self.impl
        impl.insert = self._adopting(impl.insert)
        impl.load_cache_event = threading.Event()
        impl.host_pool_group = group
        impl.cache_controller = self.cache_controller
        impl.full_kv_pool_host = self.token_to_kv_pool_host
        impl.components[self._full]._full_kv_pool_host = self.token_to_kv_pool_host
        impl.tree_core.set_hicache_enabled()
        impl.write_through_threshold = 1 if write_policy == "write_through" else 2
        impl.is_write_back = write_policy == "write_back"
        impl.load_back_threshold = load_back_threshold
        if enable_storage:  # the reset copies the controller's enable_storage into the cache
            install_page_names(modules)
            # no backend: an acknowledged write goes no further (kvpool models no backups)
            impl.write_backup_storage = lambda node_id: None
            impl.prefetch_threshold = prefetch_threshold
            impl.prefetch_stop_policy = "best_effort"
            self.storage = UnifiedStorage(self)
            if tree_core == "rust":
                core = impl.tree_core
                core.insert_host = self.storage.insert_host_pairing(core.insert_host)
        self._tree_lock = self._lock_of
        self.reset()

    def _lock_of(self, node: Any) -> Any:
        """SGLang's ``TreeLock`` on ``node`` with the receipt of its newest open lock (the
        request's: kvpool keeps one lock per request, on ``last_node``)."""
        return self.modules.attr(BASE, "TreeLock")(int(node), self.newest_receipt(node))

    def total_size(self) -> int:
        """Device tokens the tree holds (the unified cache's ``total_size()`` is ``(full,
        aux)``)."""
        return int(self.impl.total_size()[0])

    def _p(self, name: str, **kw: Any) -> Any:
        return self.modules.attr(BASE, name)(**kw)

    # ------------------------------------------------------------------ operations
    def insert(self, key: Any, value: Any = None, priority: int = 0) -> int:
        """SGLang's ``insert`` (``prev_prefix_len`` 0: the tree frees every duplicate slot);
        returns its ``prefix_len`` (host-only matched tokens included)."""
        params = self._p("InsertParams", key=to_sglang_key(self.modules, key), priority=priority,
                         value=None if value is None else as_index_tensor(value))  # fmt: skip
        with self._call():
            return int(self.impl.insert(params).prefix_len)

    def _adopting(self, method: Any) -> Any:
        """SGLang's bound ``insert`` (whoever calls it: this adapter, or SGLang's own
        ``checkpoint`` in the request lifecycle) with the Rust core's backups kept readable:
        host-only nodes an insert gives the caller's device slots keep their host slots
        (:meth:`_adopted`)."""

        def call(params: Any) -> Any:
            if self.tree_core != "rust" or params.value is None:
                return method(params)
            before = self._host_paths()
            written = len(self.cache_controller.d2h_log)
            result = method(params)
            if before:
                fresh = set(as_index_tensor(params.value).tolist())
                fresh -= set(self.cache_controller.d2h_log[written:])
                self._adopted(before, fresh)
            return result

        return call

    def _paths(self) -> dict[int, tuple[str | None, tuple[int, ...]]]:
        """Rust core: each node's extra key and tokens from the root to its end (raw ids)."""
        nodes = self.rust_nodes()
        h2t = self.cache_controller.host_token
        core = self.impl.tree_core
        own: dict[int, list[tuple[int, str | None]]] = {}
        for n in nodes:
            if n.parent is None:
                own[n.raw] = []
            elif n.value:
                own[n.raw] = [self.slot_token(s) for s in n.value]
            elif core.is_full_device_evicted(n.raw):
                own[n.raw] = [h2t.get(h, (-1, None)) for h in self._host_of_evicted(n.raw)]
            else:
                own[n.raw] = []
        paths: dict[int, tuple[str | None, tuple[int, ...]]] = {}
        for n in nodes:  # breadth-first: a parent's path is known first
            up = paths.get(n.parent, (None, ())) if n.parent is not None else (None, ())
            pairs = own[n.raw]
            extra = pairs[0][1] if pairs else up[0]
            paths[n.raw] = (extra, up[1] + tuple(t for t, _ in pairs))
        return paths

    def _host_of_evicted(self, raw: int) -> tuple[int, ...]:
        """Rust core: a host-only node's own host slots (read through the load-back spec)."""
        core = self.impl.tree_core
        spec, _ = core.build_load_back_spec(raw, None)
        info = core.collect_path_info([raw])[0][-1]
        length = int(info.path_end - info.path_start)
        return tuple(int(h) for h in spec.host_indices.tolist()[-length:])

    def _host_paths(self) -> list[tuple[str | None, tuple[int, ...], tuple[int, ...]]]:
        """Rust core: (extra key, path tokens, host slots) of every host-only node."""
        core = self.impl.tree_core
        paths = self._paths()
        return [(paths[n.raw][0], paths[n.raw][1], self._host_of_evicted(n.raw))
                for n in self.rust_nodes()
                if n.parent is not None and core.is_full_device_evicted(n.raw)]  # fmt: skip

    def _adopted(
        self, before: list[tuple[str | None, tuple[int, ...], tuple[int, ...]]], fresh: set[int]
    ) -> None:
        """Rust core: an insert gave host-only nodes (or a split's part of one) the caller's
        device slots ``fresh`` (not written during the insert); their backups stay. Pair those
        slots with the host slots the node had before: found by its path tokens inside a
        host-only node's path before the insert."""
        d2h = self.cache_controller.d2h
        core = self.impl.tree_core
        paths = self._paths()
        for n in self.rust_nodes():
            if not n.value or not set(n.value) <= fresh or not core.is_backuped(n.raw):
                continue
            extra, path = paths[n.raw]
            end, start = len(path), len(path) - len(n.value)
            for b_extra, b_path, host in before:
                first = len(b_path) - len(host)
                if b_extra == extra and first <= start and b_path[:end] == path:
                    d2h.update(zip(n.value, host[start - first : end - first], strict=True))
                    break

    def match_prefix(self, key: Any) -> UnifiedHiMatch:
        params = self._p("MatchPrefixParams", key=to_sglang_key(self.modules, key))
        with self._call():
            r = self.impl.match_prefix(params)
            device = self.node_ref(r.last_device_node)
            indices = self.impl.path_device_indices(int(device))
        return UnifiedHiMatch(indices, device, self.node_ref(r.last_host_node),
                              int(r.host_hit_length))  # fmt: skip

    def init_load_back(self, node: Any, mem_quota: int | None = None) -> tuple[Any, Any]:
        """SGLang's ``init_load_back`` from ``node`` (the match's ``last_host_node``); returns
        the device slots loaded (empty if none) and the node the request locks."""
        device = self._device_ancestor(int(node))
        params = self._p("InitLoadBackParams", best_match_node=int(node), host_hit_length=0,
                         mem_quota=mem_quota, req=_LoadReq(device))  # fmt: skip
        with self._call():
            got = self.impl.init_load_back(params)
        count, last = (0, device) if got is None else got
        if count:
            loaded = self.impl.tree_core.collect_full_device_indices(int(node), device)
        else:
            loaded = torch.empty((0,), dtype=torch.int64)
        return as_index_tensor(loaded), self.node_ref(last)

    def _device_ancestor(self, raw: int) -> int:
        """The deepest node at or above ``raw`` with its device copy."""
        core = self.impl.tree_core
        path = core.collect_path_info([raw])[0]
        for info in reversed(path):
            if not core.is_full_device_evicted(int(info.node_id)):
                return int(info.node_id)
        return int(core.root_node_handle())

    def ready_to_load_host_cache(self) -> int:
        with self._call():
            return int(self.impl.ready_to_load_host_cache())

    @staticmethod
    def _finish(queue: list[Any], num_acks: int | None) -> int:
        count = len(queue) if num_acks is None else min(num_acks, len(queue))
        for ack in queue[:count]:
            ack.finish_event.synchronize()
        return count

    def writing_check(self, num_acks: int | None = None) -> int:
        """``check_hicache_events``' write half: flush the queued writes, then the first
        ``num_acks`` acknowledgements (all when None) finish and are delivered."""
        with self._call():
            self.impl.flush_pending_backups()
            done = self._finish(self.cache_controller.ack_write_queue, num_acks)
            self.impl.writing_check(finish_count=done)
        return done

    def loading_check(self, num_acks: int | None = None) -> int:
        done = self._finish(self.cache_controller.ack_load_queue, num_acks)
        with self._call():
            self.impl.loading_check(finish_count=done)
        return done

    def evict(self, num_tokens: int) -> int:
        with self._call():
            got = self.impl.evict(self._p("EvictParams", num_tokens=num_tokens))
        return int(got.num_tokens_evicted)

    def evict_host(self, num_tokens: int) -> int:
        with self._call():
            return int(self.impl.evict_host(num_tokens))

    def inc_lock_ref(self, node: Any) -> int:
        """Lock ``node`` (None: nothing, as a session turn's request names no node); the change
        in ``evictable_size``."""
        if node is None:
            return 0
        before = int(self.impl.evictable_size())
        with self._call():
            self.impl.inc_lock_ref(int(node))
        return int(self.impl.evictable_size()) - before

    def dec_lock_ref(self, node: Any) -> int:
        """Unlock ``node`` with its newest receipt (None: nothing); the change in
        ``evictable_size``."""
        if node is None:
            return 0
        before = int(self.impl.evictable_size())
        with self._call():
            self.impl.dec_lock_ref(int(node), self.newest_receipt(node))
        return int(self.impl.evictable_size()) - before

    def evictable_size(self) -> int:
        return int(self.impl.evictable_size())

    def reset(self) -> None:
        with self._call():
            self.impl.reset()
        self._after_reset()

    # ------------------------------------------------------------------ snapshots
    def _pending(self) -> set[int]:
        return {int(n) for w in self.impl.ongoing_write_through.values()
                for n in w.publish_node_ids}  # fmt: skip

    def snapshot(self) -> TreeSnapshot:
        """kvpool's tree snapshot with the host fields (kvpool's numbering, children in id
        order; no times, hit counts, priorities or host pins: the machine compares without)."""
        rows = self._python_rows() if self.tree_core == "python" else self._rust_rows()
        return TreeSnapshot(self.page_size, False, self.eviction_policy,
                            int(self.impl.evictable_size()), int(self.impl.protected_size()),
                            tuple(rows))  # fmt: skip

    def _python_rows(self) -> list[NodeSnapshot]:
        sid, ps, pending = self.snapshot_id, self.page_size, self._pending()
        rows: list[NodeSnapshot] = []
        for node, children in self.python_nodes():
            data = node.component_data[int(self._full)]
            root = node.parent is None
            host = data.host_value
            rows.append(NodeSnapshot(
                node_id=sid(int(node.id)),
                parent_id=None if root else sid(int(node.parent.id)),
                key=() if node.key is None else key_codes(node.key),
                extra_key=None if node.key is None else node.key.extra_key,
                value=() if data.value is None else tuple(int(v) for v in list(data.value)),
                lock_ref=int(data.lock_ref),
                child_ids=tuple(sid(int(c.id)) for c in children),
                child_keys=tuple(key_codes(c.key)[:ps] for c in children),
                last_access_time=0.0,
                evicted=not root and data.value is None,
                host_value=(() if root else None) if host is None
                else tuple(int(h) for h in list(host)),
                host_ref_counter=int(data.host_lock_ref),
                write_pending=int(node.id) in pending,
            ))  # fmt: skip
        return rows

    def _rust_rows(self) -> list[NodeSnapshot]:
        core = self.impl.tree_core
        nodes = self.rust_nodes()
        sid, ps, pending = self.snapshot_id, self.page_size, self._pending()
        d2h = self.cache_controller.d2h
        host: dict[int, tuple[int, ...] | None] = {}
        for n in nodes:
            if n.parent is None:
                host[n.raw] = ()
            elif core.is_full_device_evicted(n.raw):
                host[n.raw] = self._host_of_evicted(n.raw)
            elif core.is_backuped(n.raw):
                host[n.raw] = tuple(d2h.get(d, -1) for d in n.value)
            else:
                host[n.raw] = None
        pins = {} if self.storage is None else self.storage.host_pins()
        h2d_token = self.cache_controller.host_token
        keys: dict[int, tuple[int, ...]] = {}
        extras: dict[int, str | None] = {}
        for n in nodes:
            if n.value:
                pairs = [self.slot_token(s) for s in n.value]
            else:
                pairs = [h2d_token.get(h, (-1, None)) for h in host[n.raw] or ()]
            keys[n.raw] = tuple(t for t, _ in pairs)
            extras[n.raw] = pairs[0][1] if pairs else None
        rows: list[NodeSnapshot] = []
        for n in nodes:
            root = n.parent is None
            rows.append(NodeSnapshot(
                node_id=sid(n.raw), parent_id=None if root else sid(n.parent),  # type: ignore[arg-type]
                key=keys[n.raw], extra_key=extras[n.raw], value=n.value, lock_ref=n.full_lock,
                child_ids=tuple(sid(k) for k in n.children),
                child_keys=tuple(keys[k][:ps] for k in n.children), last_access_time=0.0,
                evicted=not root and core.is_full_device_evicted(n.raw),
                host_value=host[n.raw], host_ref_counter=pins.get(n.raw, 0),
                write_pending=n.raw in pending,
            ))  # fmt: skip
        return rows

    host_snapshot_takes_parts = True
    """:meth:`host_snapshot` takes the tree's and the allocator's snapshots a caller just took
    (a lifecycle's pool snapshot reads them first: not read twice a step)."""

    def host_snapshot(
        self, tree_snap: TreeSnapshot | None = None, device_snap: AllocatorSnapshot | None = None
    ) -> HostTierSnapshot:
        """The host tier as kvpool's ``HiRadixCache.host_snapshot`` reports it (transfer node
        ids in kvpool's numbering). ``tree_snap`` / ``device_snap``: this tree's and its device
        allocator's snapshots when the caller just took them (nothing changed since), else
        read here."""
        cc = self.cache_controller
        transfers = []
        for ack in cc.transfers():
            snap = ack.snapshot()
            ids = tuple(self.snapshot_id(i) for i in snap.node_ids)
            transfers.append(type(snap)(snap.kind, ids, snap.host_indices, snap.device_indices))
        return HostTierSnapshot(
            write_policy=cc.write_policy,
            device=self.allocator.snapshot() if device_snap is None else device_snap,
            tree=self.snapshot() if tree_snap is None else tree_snap,
            host=self.token_to_kv_pool_host.snapshot(),
            transfers=tuple(transfers),
            prefetches=() if self.storage is None else self.storage.prefetch_snapshots(),
            release_queue=tuple(
                int(s) for page in cc.host_mem_release_queue for s in as_index_tensor(page).tolist()
            ),
            worker_held=tuple(cc.worker_held()),
            device_tags=tuple(device_row_tags(cc.mem_pool_device)),
            bigram_keys=self.is_eagle,
        )

    def __getattr__(self, name: str) -> Any:
        """The storage calls (``prefetch_from_storage``, ``storage_hit``, ``prefetch_io``,
        ``check_prefetch_progress``, ``release_aborted_request``,
        ``drain_storage_control_queues``) are :attr:`storage`'s when storage is on."""
        storage = self.__dict__.get("storage")
        if storage is not None and name in _STORAGE_CALLS:
            return getattr(storage, name)
        raise AttributeError(name)


_STORAGE_CALLS = frozenset({
    "prefetch_from_storage", "storage_hit", "prefetch_io", "check_prefetch_progress",
    "release_aborted_request", "drain_storage_control_queues", "ongoing_prefetch",
})  # fmt: skip

__all__ = ["SGLangUnifiedHiCache", "UnifiedHiMatch"]

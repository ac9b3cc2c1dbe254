"""SGLang 0.5.16's ``HiRadixCache`` on the CPU, behind the interface of kvpool's.

:class:`SGLangHiRadixCache` runs SGLang's own tree code (``mem_cache/hiradix_cache.py``, loaded
as a real module): ``insert``, ``match_prefix``, ``evict`` (both write policies),
``evict_host``, ``load_back`` / ``init_load_back``, ``writing_check``, ``loading_check``, the lock
counts and ``reset``. What is not SGLang's, and why it does not change what is compared:

- **Construction.** SGLang's ``__init__`` builds the host pool from the device pool, the
  ``HiCacheController`` (CUDA streams, threads, storage) and reads ``torch.distributed``; the
  adapter makes the object without it and sets the fields that ``__init__`` sets for one rank
  without storage (no groups, ``pp_size`` 1, the two thresholds, the empty ``ongoing_*``
  tables), then runs the radix cache's own ``__init__`` (which resets the tree).
- **Controller.** The transfers go through kvpool's twin ``HiCacheController`` (same queues:
  a write reserves host slots at once and queues one acknowledgement, loads queue until
  ``start_loading``), with SGLang's ``HiCacheAck`` shape (``finish_event.query()`` /
  ``synchronize()``, ``node_ids``): an acknowledgement is finished when the harness says
  (``writing_check(k)`` / ``loading_check(k)`` finish the first ``k``) or when SGLang waits for
  it (``synchronize``, write-back eviction); finishing copies the content (tags).
- **Host pool.** SGLang's ``HostKVCache`` allocator (:class:`~kvpool.sglang.host_pool.
  SGLangHostPool`) with the tags beside it; its size is kvpool's formula.
- **Clock and node ids** as :class:`~kvpool.sglang.radix.SGLangRadixCache`: each walking
  ``match_prefix`` / ``insert`` reads its own tick, node ids are per cache.
- **Storage** (``enable_storage``, the configuration's ``hicache_storage``): SGLang's tree runs
  its prefetches (``prefetch_from_storage``, the scheduler's allocation of a storage hit in
  ``_drain_storage_control_queues_impl``, ``check_prefetch_progress``,
  ``release_aborted_request``, ``drain_storage_control_queues``). No backend is attached; what
  SGLang's threads do is kvpool's model of them (specs/host_tier.md): the query thread's hit is
  the one ``storage_hit`` names (revoked below the threshold, as the thread does), and the I/O
  worker is the twin controller's ``prefetch_io`` (the content: the tags of the node's path and
  the prefetched tokens). Backups to storage are not modelled (kvpool's model has none): the
  adapter's tree writes none, where SGLang's would pin each acknowledged write's host copy
  until storage acknowledges it. Nor are page hashes: SGLang's (a C++ extension it compiles
  at run time) become one name per page of the node's tokens (:func:`_page_names`).
  ``reset`` forgets the prefetches, as kvpool's: SGLang flushes only a fully idle scheduler
  (``Scheduler.flush_cache``), which has no waiting request and so no prefetch, but its
  ``reset`` leaves ``ongoing_prefetch`` as it is.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kvpool.constants import floor_align
from kvpool.errors import SGLangLoadError
from kvpool.optimized.hicache.cache_controller import (
    HiCacheAck,
    HiCacheController,
    PrefetchOperation,
)
from kvpool.optimized.hicache.tree_view import device_row_tags
from kvpool.reference.hicache.memory_pool_host import host_pool_size
from kvpool.reference.hicache.prefetch import hit_tokens_held
from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.cache_req import token_array
from kvpool.sglang.clock import frozen_at, install_clock
from kvpool.sglang.host_pool import SGLangHostPool
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.radix import _install_node_id, key_codes, to_sglang_key, walks_tree
from kvpool.snapshot import HostTierSnapshot, NodeSnapshot, PrefetchSnapshot, TreeSnapshot
from kvpool.tags import kv_tags

_HI = "sglang.srt.mem_cache.hiradix_cache"
_RADIX = "sglang.srt.mem_cache.radix_cache"
_BASE = "sglang.srt.mem_cache.base_prefix_cache"


class _Event:
    """A CUDA event stand-in: finished when the harness or SGLang's ``synchronize`` says."""

    def __init__(self, finish: Any) -> None:
        self.done = False
        self._finish = finish

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        if not self.done:
            self._finish()
            self.done = True


class _Ack:
    """SGLang's ``HiCacheAck`` shape around kvpool's acknowledgement."""

    def __init__(self, ack: HiCacheAck, controller: HiCacheController) -> None:
        self.ack = ack
        self.node_ids = ack.node_ids
        self.num_tokens = int(ack.device_indices.numel())
        self.timing_enabled = False
        self.start_event = _Event(lambda: None)
        self.finish_event = _Event(lambda: controller.complete(ack))


def _page_names(node: Any, page_size: int) -> list[str]:
    """A node's page hashes as SGLang's tree keeps them (one per page): its tokens, page by
    page; nothing compares them (kvpool models no storage content by hash)."""
    tokens = [int(t) for t in node.key.raw_token_ids()]
    return [str(tokens[i : i + page_size]) for i in range(0, len(tokens), page_size)]


class _Queue(list[Any]):
    """A list that also answers the ``queue.Queue`` calls SGLang's drains make."""

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)

    def put(self, item: Any) -> None:
        self.append(item)

    def get_nowait(self) -> Any:
        if not self:
            raise queue.Empty
        return self.pop(0)

    def qsize(self) -> int:
        return len(self)


@dataclass(eq=False)
class _Prefetch(PrefetchOperation):
    """The twin's prefetch operation with what SGLang's tree reads of its own: the page hashes
    (one name per page of the hit) and ``is_terminated``."""

    hash_value: list[str] = field(default_factory=list)

    def is_terminated(self) -> bool:
        return self.terminated


class _Controller(HiCacheController):
    """kvpool's twin controller with SGLang's acknowledgement objects and keyword calls, and the
    storage queues SGLang's tree drains (lists that answer ``put`` / ``get_nowait``)."""

    def reset(self) -> None:
        super().reset()
        self.prefetch_buffer: list[PrefetchOperation] = _Queue()
        self.host_mem_release_queue: list[torch.Tensor] = _Queue()
        self.prefetch_revoke_queue = _Queue()
        self.prefetch_hit_queue = _Queue()
        self.ack_backup_queue = _Queue()
        self.prefetch_tokens_occupied = 0
        self.pending_tags: torch.Tensor | None = None
        """The content of the prefetch SGLang's tree is about to start (set by the adapter)."""

    def prefetch(self, request_id: str, tags: Any, *_: Any, **__: Any) -> PrefetchOperation:
        """SGLang's call passes its key, hash and prefix keys where the twin takes ``tags``: the
        content is the one the adapter computed for this prefetch (:attr:`pending_tags`)."""
        assert self.pending_tags is not None, "a prefetch the adapter did not start"
        content, self.pending_tags = self.pending_tags, None
        return _Prefetch(request_id, content)

    # Any: SGLang unpacks (tokens fetched, page hashes) where the twin returns the tokens
    def terminate_prefetch(self, operation: PrefetchOperation) -> Any:
        done = super().terminate_prefetch(operation)
        return done, getattr(operation, "hash_value", [])

    def prefetch_rate_limited(self) -> bool:
        """kvpool models no rate limit (specs/host_tier.md)."""
        return False

    def prefetch_io(self, request_id: str, num_pages: int) -> int:
        got = super().prefetch_io(request_id, num_pages)
        self.prefetch_buffer = _Queue(self.prefetch_buffer)  # the twin rebuilt it as a list
        return got

    def write(self, device_indices: Any, node_id: int = -1, **_: Any) -> torch.Tensor | None:
        got = super().write(as_index_tensor(device_indices), node_id)
        if got is not None:
            self.ack_write_queue[-1] = _Ack(self.ack_write_queue[-1], self)  # type: ignore[call-overload]
        return got

    def load(self, host_indices: Any, node_id: int = -1, **_: Any) -> torch.Tensor | None:
        return super().load(as_index_tensor(host_indices), node_id)

    def start_loading(self) -> int:
        producer = super().start_loading()
        if producer >= 0:
            self.ack_load_queue[-1] = _Ack(self.ack_load_queue[-1], self)  # type: ignore[call-overload]
        return producer

    def transfers(self) -> list[HiCacheAck]:
        """The acknowledgements in flight (writes, loads issued, loads queued)."""
        acks = self.ack_write_queue + self.ack_load_queue
        return [getattr(a, "ack", a) for a in acks] + list(self.load_queue)


class _TaggedHostPool(SGLangHostPool):
    """SGLang's host allocator with kvpool's content tags beside it."""

    def __init__(self, modules: SGLangModules, device_pool: Any, size: int, ps: int) -> None:
        super().__init__(modules, size, ps)
        self.device_pool = device_pool
        self.tags = torch.zeros(size, dtype=torch.int64)

    def clear(self) -> None:
        super().clear()
        self.tags = torch.zeros(self.size, dtype=torch.int64)

    def backup_from_device_all_layer(self, device_pool: Any, host: Any, device: Any) -> None:
        self.tags[as_index_tensor(host)] = torch.as_tensor(device_pool.read_tags(device))

    def load_to_device_all_layer(self, device_pool: Any, host: Any, device: Any) -> None:
        device_pool.write_tags(device, self.tags[as_index_tensor(host)])

    def snapshot(self) -> Any:
        snap = super().snapshot()
        return type(snap)(snap.size, snap.page_size, snap.free_slots, snap.release_slots,
                          tuple(self.tags.tolist()))  # fmt: skip


@dataclass(frozen=True)
class SGLangHiMatch:
    """``match_prefix``'s result as kvpool's ``MatchResult`` names it."""

    device_indices: torch.Tensor
    last_device_node: Any
    last_host_node: Any
    host_hit_length: int


class SGLangHiRadixCache:
    """SGLang 0.5.16's ``HiRadixCache`` (see the module docstring); ``impl`` is SGLang's."""

    def __init__(self, modules: SGLangModules, req_to_token_pool: Any, allocator: Any,
                 page_size: int, device_pool: Any, host_to_device_ratio: float,
                 eviction_policy: str = "lru", write_policy: str = "write_through",
                 load_back_threshold: int = 10, prefetch_threshold: int = 256,
                 enable_storage: bool = False, is_eagle: bool = False) -> None:  # fmt: skip
        hi = modules.module(_HI)
        cls = hi.__dict__.get("HiRadixCache")
        if cls is None:
            raise SGLangLoadError(f"SGLang {modules.version} has no mem_cache.HiRadixCache")
        self.modules, self.page_size, self.disable = modules, page_size, False
        self.is_eagle = is_eagle
        self._radix = modules.module(_RADIX)
        for module in (self._radix, hi):
            install_clock(module)
        hi.__dict__["compute_node_hash_values"] = _page_names  # its native hash is not built here
        _install_node_id(self._radix)
        self._now, self._next_id = 0.0, 0
        per_token = 2 * device_pool.head_num * device_pool.head_dim * device_pool.layer_num * 4
        size = host_pool_size(device_pool.size, per_token, host_to_device_ratio, 0, page_size)
        self.token_to_kv_pool_host = _TaggedHostPool(modules, device_pool, size, page_size)
        self.allocator = allocator
        self.cache_controller = _Controller(allocator, self.token_to_kv_pool_host, page_size,
                                            write_policy)  # fmt: skip
        impl: Any = object.__new__(cls)
        fields = dict(
            _enable_metrics_flag=False, page_size=page_size, kv_cache=device_pool,
            token_to_kv_pool_host=self.token_to_kv_pool_host, tp_group=None,
            attn_cp_group=None, attn_tp_group=None, pp_group=None, tp_world_size=1, pp_rank=0,
            pp_size=1, enable_storage=enable_storage, enable_storage_metrics=False,
            prefetch_threshold=prefetch_threshold, hicache_storage_pass_prefix_keys=False,
            extra_metric_labels=None, prefetch_stop_policy="best_effort",
            load_cache_event=threading.Event(), cache_controller=self.cache_controller,
            ongoing_write_through={}, ongoing_load_back={}, ongoing_prefetch={},
            ongoing_backup={}, prefetch_loaded_tokens_by_reqid={}, work_list=[],
            write_through_threshold=1 if write_policy == "write_through" else 2,
            load_back_threshold=load_back_threshold, evictable_host_leaves=set(),
        )  # fmt: skip
        for name, value in fields.items():
            setattr(impl, name, value)
        params = modules.attr("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")(
            disable=False, req_to_token_pool=getattr(req_to_token_pool, "impl", req_to_token_pool),
            token_to_kv_pool_allocator=getattr(allocator, "impl", allocator),
            page_size=page_size, eviction_policy=eviction_policy, is_eagle=is_eagle)  # fmt: skip
        with self._call():
            self._radix.RadixCache.__init__(impl, params)
        if enable_storage:  # no backend: a host copy goes nowhere further (module docstring)
            impl.write_backup_storage = lambda node, backup_len=None: None
        self.impl = impl

    @contextlib.contextmanager
    def _call(self, walks: bool = False) -> Iterator[None]:
        node_cls = self._radix.TreeNode
        node_cls.counter = self._next_id
        if walks:
            self._now += 1.0
        try:
            with frozen_at(self._now):
                yield
        finally:
            self._next_id = node_cls.counter

    def _walks(self, key: Any) -> bool:
        return walks_tree(key, self.page_size, self.is_eagle)

    def _params(self, name: str, **kw: Any) -> Any:
        return self.modules.attr(_BASE, name)(**kw)

    # ------------------------------------------------------------------ operations
    def insert(self, key: Any, value: Any = None, priority: int = 0) -> int:
        skey = to_sglang_key(self.modules, key)
        params = self._params("InsertParams", key=skey, priority=priority,
                              value=None if value is None else as_index_tensor(value))  # fmt: skip
        with self._call(self._walks(skey)):
            return int(self.impl.insert(params).prefix_len)

    def match_prefix(self, key: Any) -> SGLangHiMatch:
        skey = to_sglang_key(self.modules, key)
        with self._call(self._walks(skey)):
            r = self.impl.match_prefix(self._params("MatchPrefixParams", key=skey))
        return SGLangHiMatch(as_index_tensor(r.device_indices), r.last_device_node,
                             r.last_host_node, int(r.host_hit_length))  # fmt: skip

    def init_load_back(self, node: Any, mem_quota: int | None = None) -> tuple[Any, Any]:
        params = self._params("InitLoadBackParams", best_match_node=node, host_hit_length=0,
                              mem_quota=mem_quota)  # fmt: skip
        with self._call():
            loaded, last = self.impl.init_load_back(params)
        return as_index_tensor(loaded), last

    def ready_to_load_host_cache(self) -> int:
        with self._call():
            return int(self.impl.ready_to_load_host_cache())

    def _finish(self, queue: list[Any], num_acks: int | None) -> int:
        count = len(queue) if num_acks is None else min(num_acks, len(queue))
        for ack in queue[:count]:
            ack.finish_event.synchronize()
        return count

    def writing_check(self, num_acks: int | None = None) -> int:
        done = self._finish(self.cache_controller.ack_write_queue, num_acks)
        with self._call():
            self.impl.writing_check()
        return done

    def loading_check(self, num_acks: int | None = None) -> int:
        done = self._finish(self.cache_controller.ack_load_queue, num_acks)
        with self._call():
            self.impl.loading_check()
        return done

    def evict(self, num_tokens: int) -> int:
        with self._call():
            return int(self.impl.evict(self._params("EvictParams", num_tokens=num_tokens))
                       .num_tokens_evicted)  # fmt: skip

    def evict_host(self, num_tokens: int) -> int:
        """SGLang returns nothing; the host tokens freed, as kvpool's returns."""
        before = self.token_to_kv_pool_host.available_size()
        with self._call():
            self.impl.evict_host(num_tokens)
        return self.token_to_kv_pool_host.available_size() - before

    def inc_lock_ref(self, node: Any) -> int:
        with self._call():
            return int(self.impl.inc_lock_ref(node).delta or 0)

    def dec_lock_ref(self, node: Any) -> int:
        with self._call():
            return int(self.impl.dec_lock_ref(node).delta or 0)

    def evictable_size(self) -> int:
        return int(self.impl.evictable_size())

    def reset(self) -> None:
        self._next_id = 0
        with self._call():
            self.impl.reset()
        self.impl.ongoing_prefetch.clear()  # SGLang's flush has none (module docstring)

    # ------------------------------------------------------------------ storage prefetches
    @property
    def ongoing_prefetch(self) -> dict[str, Any]:
        """SGLang's prefetches in flight, by request id."""
        prefetches: dict[str, Any] = self.impl.ongoing_prefetch
        return prefetches

    def _content(self, node: Any, tokens: list[int]) -> torch.Tensor:
        """The stored content of ``tokens`` below ``node``: the tags of its path and them, in
        its namespace (its key's ``extra_key``)."""
        extra = node.key.extra_key
        path: list[int] = []
        while node.parent is not None:
            path = [int(t) for t in node.key.raw_token_ids()] + path
            node = node.parent
        tags = kv_tags(path + tokens, extra)[len(path) :]
        return torch.tensor(tags, dtype=torch.int64)

    def prefetch_from_storage(self, req_id: str, last_host_node: Any, new_input_tokens: list[int],
                              extra_key: str | None = None) -> bool:  # fmt: skip
        """SGLang's ``prefetch_from_storage``; whether a prefetch started. ``extra_key`` (the
        request's namespace) is not passed: 0.5.16 takes the node's."""
        tokens = list(new_input_tokens)
        aligned = tokens[: floor_align(len(tokens), self.page_size)]
        cc = self.cache_controller
        cc.pending_tags = self._content(last_host_node, aligned)
        with self._call():  # the scheduler passes a slice of the request's array('q')
            self.impl.prefetch_from_storage(req_id, last_host_node, token_array(tokens))
        cc.pending_tags = None
        return req_id in self.impl.ongoing_prefetch

    def storage_hit(self, req_id: str, hit_tokens: int) -> bool:
        """Storage holds the first ``hit_tokens`` tokens: SGLang's query thread as kvpool models
        it (the hit capped at the request and page-aligned; below the threshold, or once the
        prefetch was terminated, a revoke), then SGLang's own allocation step (host slots, one
        host eviction, a shorter hit, or a revoke). Whether the transfer started."""
        info = self.impl.ongoing_prefetch.get(req_id)
        if info is None or info[2].host_indices is not None:
            return False
        _, key, op = info
        cc, ps = self.cache_controller, self.page_size
        hit = 0 if op.is_terminated() else hit_tokens_held(hit_tokens, len(key), ps)
        if hit < self.impl.prefetch_threshold:
            cc.prefetch_revoke_queue.put(req_id)
        else:
            op.hash_value = [f"{req_id}/{page}" for page in range(hit // ps)]
            op.storage_hit_count = hit
            cc.prefetch_hit_queue.put(op)
        with self._call():
            self.impl._drain_storage_control_queues_impl(n_revoke=None, n_storage_hit=None,
                                                         n_backup=0, n_release=0,
                                                         log_metrics=False)  # fmt: skip
        return req_id in self.impl.ongoing_prefetch and op.host_indices is not None

    def prefetch_io(self, req_id: str, num_pages: int) -> int:
        """The I/O worker fetches up to ``num_pages`` more pages (the twin controller's)."""
        return self.cache_controller.prefetch_io(req_id, num_pages)

    def check_prefetch_progress(self, req_id: str) -> bool:
        """SGLang's ``check_prefetch_progress`` (``best_effort``: the prefetch ends now); a
        prefetch with host slots inserts what it fetched, which walks the tree (one tick)."""
        info = self.impl.ongoing_prefetch.get(req_id)
        with self._call(info is not None and info[2].host_indices is not None):
            return bool(self.impl.check_prefetch_progress(req_id))

    def release_aborted_request(self, rid: str) -> None:
        with self._call():
            self.impl.release_aborted_request(rid)

    def drain_storage_control_queues(self) -> int:
        """SGLang's drain of its storage queues; the host slots it freed (SGLang: None)."""
        before = self.token_to_kv_pool_host.available_size()
        with self._call():
            self.impl.drain_storage_control_queues()
        return self.token_to_kv_pool_host.available_size() - before

    def _prefetch_snapshots(self) -> tuple[PrefetchSnapshot, ...]:
        out = []
        for rid in sorted(self.impl.ongoing_prefetch):
            node, key, op = self.impl.ongoing_prefetch[rid]
            held = () if op.host_indices is None else tuple(op.host_indices.tolist())
            done, stopped = int(op.completed_tokens), bool(op.is_terminated())
            out.append(PrefetchSnapshot(rid, int(node.id), len(key), held, done, stopped))
        return tuple(out)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> TreeSnapshot:
        """kvpool's tree snapshot (with the host fields) of SGLang's tree."""
        nodes: list[NodeSnapshot] = []
        root = self.impl.root_node
        queue = deque([root])
        while queue:
            node = queue.popleft()
            kids = list(node.children.values())
            queue.extend(kids)
            ps = self.page_size
            host = node.host_value
            nodes.append(NodeSnapshot(
                node_id=int(node.id),
                parent_id=None if node.parent is None else int(node.parent.id),
                key=key_codes(node.key), extra_key=node.key.extra_key,
                value=() if node is root or node.value is None else tuple(node.value.tolist()),
                lock_ref=int(node.lock_ref), child_ids=tuple(int(c.id) for c in kids),
                child_keys=tuple(key_codes(c.key)[:ps] for c in kids),
                last_access_time=0.0 if node is root else float(math.floor(node.last_access_time)),
                hit_count=int(node.hit_count), priority=0 if node is root else int(node.priority),
                evicted=node is not root and node.value is None,
                host_value=None if host is None else tuple(int(h) for h in host),
                host_ref_counter=int(node.host_ref_counter),
                write_pending=node.write_through_pending_id is not None,
            ))  # fmt: skip
        return TreeSnapshot(self.page_size, False, str(self.impl.eviction_policy),
                            int(self.impl.evictable_size_), int(self.impl.protected_size_),
                            tuple(nodes))  # fmt: skip

    def host_snapshot(self) -> HostTierSnapshot:
        """The host tier as kvpool's ``HiRadixCache.host_snapshot`` reports it."""
        cc = self.cache_controller
        return HostTierSnapshot(
            write_policy=cc.write_policy,
            device=self.allocator.snapshot(),
            tree=self.snapshot(),
            host=self.token_to_kv_pool_host.snapshot(),
            transfers=tuple(a.snapshot() for a in cc.transfers()),
            prefetches=self._prefetch_snapshots(),
            release_queue=tuple(int(s) for page in cc.host_mem_release_queue
                                for s in page.tolist()),
            worker_held=tuple(cc.worker_held()),
            device_tags=tuple(device_row_tags(cc.mem_pool_device)),
            bigram_keys=self.is_eagle,
        )  # fmt: skip


__all__ = ["SGLangHiRadixCache"]

"""Storage prefetches through SGLang 0.5.23's ``UnifiedRadixCache`` (FULL component, cache mode,
``best_effort``, one rank), for :class:`~kvpool.sglang.unified_hicache.SGLangUnifiedHiCache` on
either of SGLang's tree cores.

SGLang's cache code runs as is: ``prefetch_from_storage``, the storage-hit allocation, the
acknowledgement drain and the release drain (``_drain_storage_control_queues_impl``),
``check_prefetch_progress`` (with ``_handle_prefetch_result`` and the tree core's
``insert_host``), ``release_aborted_request``. What is kvpool's, as kvpool models SGLang's
threads and scheduler (specs/unified_cache.md, "Storage prefetches"):

- **the scheduler's gate** (``Scheduler._prefetch_kvcache``): a prefetch starts only below a
  node that is backed up or the root, in the request's namespace;
- **the controller's storage calls** (:class:`StorageController`, restated from
  ``HybridCacheController`` / ``HiCacheController``: SGLang's are methods of a controller that
  starts threads and streams): ``submit_prefetch`` makes the operation, ``prefetch_rate_limited``
  compares the requested tokens in flight with half the host pool, ``allocate_storage_hit``
  allocates the hit, evicts host memory once for it, then tries the largest page-aligned part
  that fits and reaches the threshold, ``terminate_prefetch`` marks the operation,
  ``append_host_mem_release`` queues pages;
- **the query thread** (``storage_hit``): storage holds the hit ``storage_hit`` names (capped at
  the request, whole pages; nothing for a terminated operation), put on the hit queue, which
  SGLang's drain then allocates;
- **the I/O worker** (``prefetch_io``): reads the whole transfer in one batch (nothing once
  terminated), the tags landing in the host slots, and sends the batch's acknowledgement and
  the end's; they count when ``drain_storage_control_queues`` drains them;
- page hashes are names (one per page, as hex digests); no backend, no storage backups.

On the Rust core, whose binding reports no host slots, the adapter reads a host-only node's
slots through its load-back spec and its tokens from the host slot -> token map the I/O worker
fills; a device node an ``insert_host`` refills pairs its device slots with the fetched slots of
its tokens (:meth:`UnifiedStorage.insert_host_pairing`).
"""

from __future__ import annotations

import hashlib
import queue
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from kvpool.constants import floor_align
from kvpool.reference.hicache.prefetch import hit_tokens_held
from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.cache_req import token_array
from kvpool.sglang.hiradix import _page_names
from kvpool.sglang.unified_controller import UnifiedController
from kvpool.snapshot import PrefetchSnapshot
from kvpool.tags import kv_tags


class Queue(list[Any]):
    """A list that also answers the ``queue.Queue`` calls SGLang's drains make."""

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)

    def put(self, item: Any) -> None:
        self.append(item)

    def get(self, *_: Any, **__: Any) -> Any:
        if not self:
            raise queue.Empty
        return self.pop(0)

    get_nowait = get

    def empty(self) -> bool:
        return not self

    def qsize(self) -> int:
        return len(self)


@dataclass(eq=False)
class Prefetch:
    """The fields of SGLang's ``PrefetchOperation`` its cache reads and writes, and ``tags``:
    the stored content of the requested tokens (kvpool's)."""

    handle: Any
    tags: torch.Tensor
    tokens: tuple[tuple[int, str | None], ...] = ()
    """Each requested token with its namespace (what a fetched host slot holds)."""
    host_indices: torch.Tensor | None = None
    hash_value: list[str] = field(default_factory=list)
    storage_hit_count: int = 0
    completed_tokens: int = 0
    terminated: bool = False
    pool_transfers: Any = None
    pool_transfers_done: bool = True
    pool_storage_result: Any = None
    query_pool_hit_pages: dict[Any, int] = field(default_factory=dict)
    ack_releases_incomplete_host_indices: bool = True
    deadline_expired: bool = False
    assume_stored: bool = False
    all_hash_values: Any = None
    buffer_host_occupied_units: Any = None
    sidecar_hash_values: Any = None
    sidecar_hit_pages: int = 0
    stats_requested_tokens: int = 0
    storage_start: int = 0

    @property
    def request_id(self) -> str:
        return str(self.handle.rid)

    def is_terminated(self) -> bool:
        return self.terminated

    def mark_terminate(self) -> None:
        self.terminated = True


@dataclass(eq=False)
class PrefetchAck:
    """SGLang's ``PrefetchAck``: tokens read so far, or the end (``completed_req``)."""

    rid: str
    operation: Prefetch
    completed_tokens: int | None = None
    pool_hits: Any = None
    completed_req: bool = False


@dataclass(eq=False)
class Submission:
    """SGLang's ``PrefetchSubmission`` of one rank without PP tickets."""

    operation: Prefetch | None = None
    decision: bool | None = None


class StorageController(UnifiedController):
    """The unified cache's controller (:class:`~kvpool.sglang.unified_controller.
    UnifiedController`) with the storage calls and queues SGLang's cache makes of it (see the
    module docstring)."""

    def __init__(self, allocator: Any, host: Any, page_size: int, policy: str) -> None:
        super().__init__(allocator, host, page_size, policy)
        self.enable_storage = True

    def reset(self) -> None:
        """Every queue empty, nothing in flight (``HybridCacheController.reset``)."""
        super().reset()
        # SGLang's names, over queues typed here (the twin's attributes are typed lists)
        self.buffer, self.acks, self.releases = Queue(), Queue(), Queue()
        self.prefetch_buffer = self.buffer
        self.ack_prefetch_queue = self.acks
        self.host_mem_release_queue = self.releases
        self.prefetch_hit_queue = Queue()
        self.ack_backup_queue = Queue()
        self.extra_host_mem_release_queues: dict[Any, Queue] = {}
        self.pp_prefetch_decisions: dict[str, Any] = {}
        self.prefetch_tokens_occupied = 0
        self.pending_tags: torch.Tensor | None = None
        """The content of the prefetch SGLang's cache is about to submit (set by the adapter)."""
        self.pending_tokens: tuple[tuple[int, str | None], ...] = ()

    @property
    def prefetch_capacity_limit(self) -> int:
        return int(0.5 * self.mem_pool_host.size)

    def prefetch_rate_limited(self) -> bool:
        return bool(self.prefetch_tokens_occupied >= self.prefetch_capacity_limit)

    def get_prefetch_submission(self, rid: str) -> None:
        return None

    def submit_prefetch(self, handle: Any, *_: Any, **__: Any) -> Submission:
        assert self.pending_tags is not None, "a prefetch the adapter did not start"
        op = Prefetch(handle, self.pending_tags, self.pending_tokens)
        self.pending_tags, self.pending_tokens = None, ()
        return Submission(operation=op)

    def allocate_storage_hit(self, operation: Prefetch, hit_tokens: int, *, allow_partial: bool,
                             min_tokens: int, evict_host: Any) -> tuple[Any, int]:  # fmt: skip
        host_indices = self.mem_pool_host.alloc(hit_tokens)
        if host_indices is None:
            evict_host(hit_tokens)
            host_indices = self.mem_pool_host.alloc(hit_tokens)
        if host_indices is not None or not allow_partial:
            return host_indices, hit_tokens
        available = int(self.mem_pool_host.available_size())
        alloc_len = min(hit_tokens, available - available % self.page_size)
        if alloc_len >= min_tokens:
            host_indices = self.mem_pool_host.alloc(alloc_len)
        return host_indices, alloc_len

    def terminate_prefetch(self, operation: Prefetch) -> tuple[int, list[str]]:  # type: ignore[override]
        operation.mark_terminate()
        return operation.completed_tokens, operation.hash_value

    def append_host_mem_release(self, host_indices: Any = None, extra_pools: Any = None) -> None:
        if host_indices is None:
            return
        slots = as_index_tensor(host_indices)
        for start in range(0, int(slots.numel()), self.page_size):
            self.releases.put(slots[start : start + self.page_size])

    def read_transfer(self, request_id: str, num_pages: int) -> int:
        """The I/O worker (see the module docstring); the tokens it read."""
        op = next((o for o in self.buffer if o.request_id == request_id), None)
        if op is None or op.host_indices is None or not num_pages:
            return 0
        got = 0 if op.is_terminated() else len(op.hash_value) * self.page_size
        self.mem_pool_host.tags[op.host_indices[:got]] = op.tags[:got]
        for h, token in zip(op.host_indices[:got].tolist(), op.tokens, strict=False):
            self.host_token[int(h)] = token  # what the Rust core's snapshot reads keys from
        self.buffer.remove(op)
        self.acks.put(PrefetchAck(request_id, op, completed_tokens=got))
        self.acks.put(PrefetchAck(request_id, op, completed_req=True))
        return got

    def worker_held(self) -> list[int]:
        """Host slots of transfers the worker has not ended (in the buffer, or their end not
        drained yet), past the tokens their prefetch counted."""
        ended = [a.operation for a in self.acks if a.completed_req]
        out: list[int] = []
        for op in list(self.buffer) + ended:
            if op.host_indices is not None:
                out += op.host_indices[op.completed_tokens :].tolist()
        return out


class UnifiedStorage:
    """The storage prefetch calls of :class:`~kvpool.sglang.unified_hicache.SGLangUnifiedHiCache`
    (its ``storage``), each SGLang's cache method where SGLang has one."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.cc: StorageController = cache.cache_controller

    @property
    def ongoing_prefetch(self) -> dict[str, Any]:
        """SGLang's prefetches in flight by request id (it keys them by request handle)."""
        return {h.rid: info for h, info in self.cache.impl.ongoing_prefetch.items()}

    def host_pins(self) -> dict[int, int]:
        """Raw node id -> the prefetches in flight that pinned its host copy (their receipts
        name a host lock: SGLang takes none on the root under write-through). The Rust
        binding reports no host lock counts; on a FULL-only tree a host lock is FULL's."""
        pins: dict[int, int] = {}
        for info in self.cache.impl.ongoing_prefetch.values():
            params = info.anchor_lock_params
            if params is not None and params.component_host_lock_uuids:
                raw = int(info.anchor_node_id)
                pins[raw] = pins.get(raw, 0) + 1
        return pins

    def _handle(self, rid: str) -> Any:
        return self.cache.modules.attr(_BASE_PREFIX, "CacheRequestHandle")(rid, 0)

    def prefetch_from_storage(self, req_id: str, last_host_node: Any, new_input_tokens: list[int],
                              extra_key: str | None = None) -> bool:  # fmt: skip
        """The scheduler's gate, then SGLang's ``prefetch_from_storage``; whether it started."""
        cache = self.cache
        core, anchor = cache.impl.tree_core, int(last_host_node)
        if not (core.is_root(anchor) or core.is_backuped(anchor)):
            return False
        tokens = list(new_input_tokens)
        aligned = tokens[: floor_align(len(tokens), cache.page_size)]
        path = self._path(anchor)
        self.cc.pending_tags = torch.tensor(kv_tags(path + aligned, extra_key)[len(path) :],
                                            dtype=torch.int64)  # fmt: skip
        self.cc.pending_tokens = tuple((t, extra_key) for t in aligned)
        handle = self._handle(req_id)
        with cache._call():  # the scheduler passes a slice of the request's array('q')
            cache.impl.prefetch_from_storage(handle, anchor, token_array(tokens),
                                             extra_key=extra_key)  # fmt: skip
        self.cc.pending_tags = None
        return handle in cache.impl.ongoing_prefetch

    def _path(self, raw: int) -> list[int]:
        """The tokens from the root to the end of node ``raw``."""
        if self.cache.tree_core == "rust":
            return list(self.cache._paths()[raw][1])
        path: list[int] = []
        node = self.cache.impl.tree_core.node_by_id(raw)
        while node.parent is not None:
            path = [int(t) for t in node.key.raw_token_ids()] + path
            node = node.parent
        return path

    def insert_host_pairing(self, method: Any) -> Any:
        """The Rust core's ``insert_host`` with its refills kept readable: the binding reports
        no host slots of a device node, which the adapter's snapshot reads from its device ->
        host slot map; a device node the call gives a host copy pairs its device slots with the
        fetched slots of its tokens."""

        def call(node_id: Any, key: Any, host_value: Any, hash_value: Any) -> Any:
            cache = self.cache
            before = {d for n in cache.rust_nodes() if n.value and cache.impl.tree_core
                      .is_backuped(n.raw) for d in n.value}  # fmt: skip
            start = len(cache._paths()[int(node_id)][1])
            result = method(node_id, key, host_value, hash_value)
            fetched = as_index_tensor(host_value).tolist()
            paths = cache._paths()
            for n in cache.rust_nodes():
                if not n.value or not cache.impl.tree_core.is_backuped(n.raw):
                    continue
                first = len(paths[n.raw][1]) - len(n.value) - start
                for j, d in enumerate(n.value):
                    if d not in before and 0 <= first + j < len(fetched):
                        self.cc.d2h[d] = fetched[first + j]
            return result

        return call

    def storage_hit(self, req_id: str, hit_tokens: int) -> bool:
        """The query thread's answer (see the module docstring), then SGLang's drain of the
        hit queue (allocation or revoke); whether the transfer has host slots."""
        info = self.cache.impl.ongoing_prefetch.get(self._handle(req_id))
        if info is None or info.operation.host_indices is not None:
            return False
        op = info.operation
        ps = self.cache.page_size
        hit = 0 if op.is_terminated() else hit_tokens_held(hit_tokens, len(info.prefetch_key), ps)
        op.hash_value = [_digest(f"{req_id}/{page}") for page in range(hit // ps)]
        op.storage_hit_count = hit
        self.cc.prefetch_hit_queue.put(op)
        self._drain(hits=None, acks=0, release=0)
        info = self.cache.impl.ongoing_prefetch.get(self._handle(req_id))
        return info is not None and info.operation.host_indices is not None

    def _drain(self, hits: int | None, acks: int | None, release: int | None) -> None:
        with self.cache._call():
            self.cache.impl._drain_storage_control_queues_impl(hits, acks, 0, release, {}, False)

    def prefetch_io(self, req_id: str, num_pages: int) -> int:
        return self.cc.read_transfer(req_id, num_pages)

    def check_prefetch_progress(self, req_id: str) -> bool:
        with self.cache._call():
            return bool(self.cache.impl.check_prefetch_progress(self._handle(req_id)))

    def release_aborted_request(self, rid: str) -> None:
        with self.cache._call():
            self.cache.impl.release_aborted_request(self._handle(rid))

    def drain_storage_control_queues(self) -> int:
        """SGLang's drain of every storage queue; the host slots it freed (SGLang: None)."""
        before = int(self.cache.token_to_kv_pool_host.available_size())
        self._drain(hits=None, acks=None, release=None)
        return int(self.cache.token_to_kv_pool_host.available_size()) - before

    def prefetch_snapshots(self) -> tuple[PrefetchSnapshot, ...]:
        out = []
        sid = self.cache.snapshot_id
        for handle, info in sorted(self.cache.impl.ongoing_prefetch.items(),
                                   key=lambda item: item[0].rid):  # fmt: skip
            op = info.operation
            held = () if op.host_indices is None else tuple(op.host_indices.tolist())
            out.append(PrefetchSnapshot(handle.rid, sid(int(info.anchor_node_id)),
                                        len(info.prefetch_key), held, int(op.completed_tokens),
                                        bool(op.is_terminated())))  # fmt: skip
        return tuple(out)


def _digest(name: str) -> str:
    """A page's storage hash: a name, as a 64-digit hex digest (the Rust core parses a node's
    last hash as one when it hashes a child's pages)."""
    return hashlib.sha256(name.encode()).hexdigest()


_BASE_PREFIX = "sglang.srt.mem_cache.base_prefix_cache"
_CORE = "sglang.srt.mem_cache.unified_cache.unified_tree_core"


def install_page_names(modules: Any) -> None:
    """The Python tree core's page hashes (a storage key per page, computed when storage is
    on) as names (:func:`kvpool.sglang.hiradix._page_names`): SGLang's native hash is a C++
    extension it compiles at run time, and nothing here compares them."""
    modules.module(_CORE).__dict__["compute_node_hash_values"] = _page_names


__all__ = ["PrefetchAck", "StorageController", "UnifiedStorage"]

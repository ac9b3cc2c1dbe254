"""SGLang 0.5.16's scheduler glue for a hybrid sliding-window model with the radix cache on: the
glue of :mod:`kvpool.sglang.glue_v0516_swa` over the tree 0.5.16's registry builds then, its own
FULL+SWA ``UnifiedRadixCache`` (:class:`SGLangUnified16SWAGlueTree`).

The cache's own ``cache_unfinished_req`` / ``cache_finished_req`` read and write the request's
``swa_uuid_for_lock``, ``swa_prefix_lock_released`` and ``last_node``
(:class:`SWARadixGlueReqV0516`: any other field raises AttributeError as in the radix-off
stand-in); the oracle pairs kvpool's model of the same tree with those hand-overs
(``Rules.swa_tree="unified"``: ``UnifiedSWARadixLifecycleV0516``).
:func:`swa_manager_factory_v0516` picks the manager of a sliding-window configuration: this one,
the radix-off one, or kvpool's own SWA lifecycle.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.optimized.req import Req
from kvpool.sglang.cache_req import InsertedLen
from kvpool.sglang.glue_swa import SWAReqState
from kvpool.sglang.glue_v0516 import (
    KvRecords,
)
from kvpool.sglang.glue_v0516_swa import (
    SGLangSWAGlueManagerV0516,
    SWAGlueReqV0516,
    glue_covers_v0516_swa,
)
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.req_to_token import SGLangReqToTokenPool
from kvpool.sglang.swa import SGLangSWAAllocator
from kvpool.sglang.unified16_base import raw_node
from kvpool.sglang.unified16_swa_radix import SGLangUnified16SWARadixCache
from kvpool.sglang.unified_base import BASE

UNIFIED16_TREE_CALLS = (
    "cache_finished_req",
    "cache_unfinished_req",
    "evict",
    "inc_lock_ref",
    "dec_lock_ref",
)
"""The methods of 0.5.16's ``UnifiedRadixCache`` whose calls
:class:`SGLangUnified16SWAGlueTree` counts."""


class SGLangUnified16SWAGlueTree(SGLangUnified16SWARadixCache):
    """SGLang 0.5.16's FULL+SWA ``UnifiedRadixCache`` over the manager's ``ReqToTokenPool``
    and SWA allocator, as :class:`SGLangSWARadixGlueManagerV0516` uses it: ``impl`` is what
    0.5.16's glue calls (its ``cache_finished_req`` / ``cache_unfinished_req``, which lock and
    unlock with the request's ``swa_uuid_for_lock``); the rest is the adapter's
    (:class:`~kvpool.sglang.unified16_swa_radix.SGLangUnified16SWARadixCache`: kvpool's node
    numbers, the snapshot, the match) with the lifecycle's own lock calls:
    :meth:`inc_lock_ref` records SGLang's uuid (:attr:`last_uuid`, which the manager keeps for
    the request, as 0.5.16's ``PrefillAdder._req_inc_lock_ref`` does) and :meth:`dec_lock_ref`
    hands back the receipt the manager set (:attr:`receipt`: the uuid the lock's holder
    keeps)."""

    def __init__(self, modules: SGLangModules, pool: SGLangReqToTokenPool,
                 alloc: SGLangSWAAllocator, page_size: int, window: int,
                 eviction_policy: str, is_eagle: bool = False) -> None:  # fmt: skip
        super().__init__(modules, alloc, page_size, window, eviction_policy,
                         req_to_token_pool=pool.impl, is_eagle=is_eagle)  # fmt: skip
        self.req_to_token_pool = pool
        self.token_to_kv_pool_allocator = alloc
        self.eviction_policy = eviction_policy
        self._inserted = InsertedLen()
        self.last_uuid: int | None = None
        """SGLang's ``swa_uuid_for_lock`` of the last lifecycle lock (None: the window lock
        reached the root)."""
        self.receipt: int | None = None
        """SGLang's uuid the next lifecycle unlock hands back (consumed by it)."""
        self.calls: Counter[str] = Counter()
        """Calls of the cache's methods in :data:`UNIFIED16_TREE_CALLS` (the glue's and the
        lifecycle's), as ``unified_radix_cache.NAME``."""
        for name in UNIFIED16_TREE_CALLS:
            setattr(self.impl, name, self._counted(name, getattr(self.impl, name)))

    def _counted(self, name: str, method: Any) -> Any:
        key = f"unified_radix_cache.{name}"

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[key] += 1
            return method(*args, **kwargs)

        return call

    def inc_lock_ref(self, node: Any) -> int:
        """SGLang's ``inc_lock_ref(node)``; its uuid goes to :attr:`last_uuid`. Returns 0."""
        with self._call():
            result = self.impl.inc_lock_ref(raw_node(node))
        self.last_uuid = result.swa_uuid_for_lock
        return 0

    def dec_lock_ref(
        self, node: Any, swa_uuid_for_lock: int | None = None, skip_swa: bool = False
    ) -> None:
        """SGLang's ``dec_lock_ref(node, DecLockRefParams(swa_uuid_for_lock=...))`` with the
        :attr:`receipt` (consumed), or with kvpool's uuid ``swa_uuid_for_lock`` when one is
        given; None: nothing."""
        receipt, self.receipt = self.receipt, None
        if node is None:
            return
        if swa_uuid_for_lock is not None:
            super().dec_lock_ref(node, swa_uuid_for_lock, skip_swa)
            return
        params = self.modules.attr(BASE, "DecLockRefParams")(swa_uuid_for_lock=receipt)
        with self._call():
            self.impl.dec_lock_ref(raw_node(node), params, skip_swa)

    def evictable_size(self) -> int:
        return self.full_evictable_size()

    def protected_size(self) -> int:
        return self.full_protected_size()


class _SWALock:
    """0.5.16's per-request lock fields: ``swa_uuid_for_lock`` and
    ``swa_prefix_lock_released``."""

    __slots__ = ("released", "uuid")

    def __init__(self) -> None:
        self.uuid: int | None = None
        self.released = False


class SWARadixGlueReqV0516(SWAGlueReqV0516):
    """:class:`SWAGlueReqV0516` with what 0.5.16's unified cache reads and writes besides:
    ``swa_uuid_for_lock`` and ``swa_prefix_lock_released`` (read / write: the request's
    :class:`_SWALock`), ``last_node`` as SGLang's node object (kvpool keeps its numbered
    reference)."""

    __slots__ = ("lock",)
    lock: _SWALock

    def __init__(self, req: Any, records: KvRecords, state: SWAReqState, lock: _SWALock,
                 *args: Any) -> None:  # fmt: skip
        super().__init__(req, records, state, *args)
        object.__setattr__(self, "lock", lock)

    @property
    def swa_uuid_for_lock(self) -> int | None:
        return self.lock.uuid

    @swa_uuid_for_lock.setter
    def swa_uuid_for_lock(self, value: int | None) -> None:
        self.lock.uuid = None if value is None else int(value)

    @property
    def swa_prefix_lock_released(self) -> bool:
        return self.lock.released

    @swa_prefix_lock_released.setter
    def swa_prefix_lock_released(self, value: bool) -> None:
        self.lock.released = bool(value)

    @property
    def last_node(self) -> Any:
        node = self.req.last_node
        return None if node is None else raw_node(node)

    @last_node.setter
    def last_node(self, node: Any) -> None:
        self.req.last_node = None if node is None else self._node(node)


class SGLangSWARadixGlueManagerV0516(SGLangSWAGlueManagerV0516):
    """The SWA lifecycle over SGLang 0.5.16's components with the radix cache on: 0.5.16's glue
    over its FULL+SWA ``UnifiedRadixCache`` (:class:`SGLangUnified16SWAGlueTree`), the window
    as with the chunk cache (``maybe_evict_swa``: decodes and EAGLE v2 steps only, the tree not
    being a chunk cache; the radix frontier keeps ``max(window, page)``). The cache's own
    ``cache_unfinished_req`` (a chunk boundary, through ``maybe_cache_unfinished_req``) and
    ``cache_finished_req`` (``release_kv_cache``) read and write the request's lock fields
    (:class:`SWARadixGlueReqV0516`); kvpool's own lock calls (its match, a waiting request's
    abort, a session's close: kvpool's emulation) hand SGLang the uuid the holder keeps. A
    session turn hands its lock fields to the session with its row. The oracle is kvpool's SWA
    lifecycle under ``Rules.for_sglang("0.5.16")`` (``swa_tree="unified"``:
    :class:`~kvpool.reference.lifecycle.swa_radix_lifecycle.UnifiedSWARadixLifecycleV0516`)."""

    radix_cache = True

    def __init__(
        self, config: PoolConfig, modules: SGLangModules, naive_extend: bool = False
    ) -> None:
        if config.rules.swa_tree != "unified":
            raise ConfigError("SGLang 0.5.16's radix-cache tree for a sliding-window model is its "
                              "UnifiedRadixCache: Rules.swa_tree must be 'unified' "
                              "(Rules.for_sglang('0.5.16'))")  # fmt: skip
        self._locks: dict[str, _SWALock] = {}
        self._session_locks: dict[str, _SWALock] = {}
        super().__init__(config, modules, naive_extend)
        tree: Any = self.tree_cache
        self.glue_calls.append(tree.calls)

    def _build_tree(self, modules: SGLangModules, pool: SGLangReqToTokenPool,
                    alloc: SGLangSWAAllocator, config: PoolConfig, window: int) -> Any:  # fmt: skip
        """0.5.16's FULL+SWA ``UnifiedRadixCache`` (:class:`SGLangUnified16SWAGlueTree`)."""
        return SGLangUnified16SWAGlueTree(modules, pool, alloc, config.page_size, window,
                                          config.eviction_policy, config.is_eagle)  # fmt: skip

    def _lock(self, req: Req) -> _SWALock:
        return self._locks.setdefault(req.rid, _SWALock())

    def _glue(self, req: Req) -> SWARadixGlueReqV0516:  # type: ignore[override]
        self._bind()
        tree: Any = self.tree_cache
        return SWARadixGlueReqV0516(req, self._records, self._state(req), self._lock(req),
                                    tree._inserted, None, tree.node_ref)  # fmt: skip

    @contextlib.contextmanager
    def _receipt(self, lock: _SWALock | None) -> Iterator[None]:
        """kvpool's own unlock inside hands SGLang ``lock``'s uuid."""
        tree: Any = self.tree_cache
        tree.receipt = lock.uuid if lock is not None else None
        try:
            yield
        finally:
            tree.receipt = None

    def _match(self, req: Req, cow: bool, load_back: bool) -> int:
        """kvpool's match over SGLang's tree, the lock on the node it found (the scheduler's
        ``_req_inc_lock_ref``: the uuid is kept for the request), the old lock released with
        its own uuid. A session turn's restore is kvpool's (its lock comes with the row)."""
        if self._restoring_session(req) is not None:
            return super()._match(req, cow, load_back)
        lock = self._lock(req)
        with self._receipt(lock):
            found = super()._match(req, cow, load_back)
        tree: Any = self.tree_cache
        lock.uuid, lock.released = tree.last_uuid, False
        return found

    def _unmatch(self, req: Req) -> None:
        with self._receipt(self._locks.pop(req.rid, None)):
            super()._unmatch(req)

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """0.5.16's ``release_kv_cache`` (its unified ``cache_finished_req`` unlocks with the
        request's uuid), then the request's lock fields are forgotten."""
        super().release_kv_cache(req, is_insert)
        self._locks.pop(req.rid, None)

    def extend(
        self, rids: Sequence[str], chunk_sizes: Sequence[int | None] | None = None
    ) -> torch.Tensor:
        """A restored session turn takes the session's lock fields with its row (before the
        extend's glue reads them; a refused extend leaves them to the session)."""
        carried: dict[str, str] = {}
        for rid in rids:
            req = self.reqs.get(rid)
            if req is not None and self._restoring_session(req) is not None:
                assert req.session_id is not None
                carried[rid] = req.session_id
                self._locks[rid] = self._session_locks.get(req.session_id, _SWALock())
        try:
            out: torch.Tensor = super().extend(rids, chunk_sizes)
        except BaseException:
            for rid in carried:
                self._locks.pop(rid, None)
            raise
        for sid in carried.values():
            self._session_locks.pop(sid, None)
        return out

    def finish(
        self,
        rids: Sequence[str],
        is_insert: bool = True,
        finished_lens: Sequence[int | None] | None = None,
    ) -> None:
        """A session turn hands its lock fields to the session with its row."""
        handed: dict[str, _SWALock] = {}
        for rid in rids:
            req = self.reqs.get(rid)
            if req is not None and req.session_id is not None and self._session_of(req):
                handed[req.session_id] = self._locks.get(rid, _SWALock())
        super().finish(rids, is_insert, finished_lens)  # a refused finish changes nothing
        for rid in rids:
            self._locks.pop(rid, None)
        self._session_locks.update(handed)

    def close_session(self, session_id: str) -> None:
        """kvpool's close, its unlock handing SGLang the session's uuid."""
        with self._receipt(self._session_locks.get(session_id)):
            super().close_session(session_id)
        self._session_locks.pop(session_id, None)


def swa_manager_factory_v0516(modules: SGLangModules, naive_extend: bool = False) -> Any:
    """``swa_manager(config)`` of 0.5.16's implementation: 0.5.16's glue where
    :func:`glue_covers_v0516_swa` says so (:class:`SGLangSWAGlueManagerV0516` over its
    ``SWAChunkCache`` with the radix cache off,
    :class:`SGLangSWARadixGlueManagerV0516` over its
    unified tree with it on); otherwise kvpool's own SWA lifecycle (the torch twin's,
    checked). ``naive_extend``: SGLang's SWA allocator extends on its torch path
    (``+naive``)."""

    def build(config: PoolConfig) -> Any:
        if glue_covers_v0516_swa(config) and config.disable_radix_cache:
            return SGLangSWAGlueManagerV0516(config, modules, naive_extend)
        if glue_covers_v0516_swa(config):
            return SGLangSWARadixGlueManagerV0516(config, modules, naive_extend)
        from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager

        return SWAMemoryManager(config, checked=True)

    return build


__all__ = [
    "UNIFIED16_TREE_CALLS",
    "SGLangSWARadixGlueManagerV0516",
    "SGLangUnified16SWAGlueTree",
    "SWARadixGlueReqV0516",
    "swa_manager_factory_v0516",
]

"""SGLang 0.5.16's scheduler glue with the host tier (``--enable-hierarchical-cache``, no hybrid
model): :class:`SGLangHiCacheGlueManagerV0516`.

0.5.16's registry builds ``HiRadixCache`` for a full-attention model with the hierarchical cache
(``mem_cache/registry.py``). Its memory glue is the full-attention family's
(:mod:`kvpool.sglang.glue_v0516`: ``alloc_for_extend``, ``alloc_for_decode``,
``alloc_for_spec_decode``, ``maybe_cache_unfinished_req``, ``release_kv_cache``), over a tree
that inherits ``RadixCache.cache_finished_req`` / ``cache_unfinished_req`` and overrides
``insert`` (write-through backups), ``match_prefix`` (the host hit), ``evict`` (write-through /
write-back) and the lock counts; the host tier adds no glue function. What the scheduler adds
are calls into the tree, made here where 0.5.16's scheduler makes them:

==============================  ===========================================================
kvpool step                     SGLang 0.5.16 called
==============================  ===========================================================
``match_prefix`` (admission)    the tree's ``match_prefix`` (kvpool's match, as the glue
                                family's); with a host hit, ``PrefillAdder.add_one_req``'s
                                load-back: the device match locked for the call
                                (``_lock_node``), ``init_load_back(InitLoadBackParams(
                                best_match_node, host_hit_length, req))``; the prefix grows
                                by the loaded slots and the last node becomes the loaded one
``extend``                      ``ready_to_load_host_cache`` (the batch build, just before
                                ``prepare_for_extend``), then the glue's ``alloc_for_extend``;
                                the forward waits for the loads' content (their
                                acknowledgements stay pending)
``decode``                      ``flush_write_through_acks`` (``update_running_batch``), then
                                the glue's ``alloc_for_decode``
``hicache_ack_writes(k)``       the first ``k`` write transfers report done, then
                                ``check_hicache_events`` (each prefill scheduling's event
                                check: ``writing_check``, ``loading_check``)
``hicache_ack_loads(k)``        ``ready_to_load_host_cache`` (loads queued but not issued),
                                the first ``k`` load transfers report done, then
                                ``check_hicache_events``
==============================  ===========================================================

0.5.16 has no write queue (``flush_pending_backups`` is 0.5.23's): writes are issued by the
tree's ``insert``. The tree is :class:`SGLangHiRadixLifecycle`: kvpool's adapter of SGLang's
``HiRadixCache`` (:class:`~kvpool.sglang.hiradix.SGLangHiRadixCache`) with what the lifecycle
and the glue need besides (see its docstring). The tree calls made here are counted in
:attr:`SGLangHiCacheGlueManagerV0516.host_glue` (``hiradix_cache.NAME``), beside the glue
modules' counts.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError
from kvpool.optimized.radix_key import MatchResult
from kvpool.optimized.req import Req
from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.cache_req import InsertedLen
from kvpool.sglang.clock import frozen_at
from kvpool.sglang.glue_v0516 import SGLangGlueManagerV0516, covers_host_tier_v0516
from kvpool.sglang.hiradix import SGLangHiMatch, SGLangHiRadixCache
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.radix import to_sglang_key

_BASE = "sglang.srt.mem_cache.base_prefix_cache"

_COUNTED = (
    "evict",
    "inc_lock_ref",
    "dec_lock_ref",
    "cache_finished_req",
    "cache_unfinished_req",
    "init_load_back",
    "ready_to_load_host_cache",
    "flush_write_through_acks",
    "check_hicache_events",
    "writing_check",
    "loading_check",
)
"""``HiRadixCache`` methods the glue or the scheduler calls on SGLang's object directly: each runs
with this cache's node counter and clock (the walks, ``insert`` / ``match_prefix``, tick too)."""


class _MHASizeView:
    """A KV pool seen with one head of one element on one layer (what the base adapter reads to
    compute a token's bytes, unused without a byte budget); everything else is the pool's."""

    head_num = head_dim = layer_num = 1

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class SGLangHiRadixLifecycle(SGLangHiRadixCache):
    """SGLang 0.5.16's ``HiRadixCache`` as the lifecycle's tree (``impl`` is SGLang's object):

    - the glue calls SGLang's object directly (``cache_finished_req``, ``cache_unfinished_req``,
      ``evict`` through ``evict_from_tree_cache``) and those call its ``insert`` /
      ``match_prefix``: the instance's methods are wrapped so that every call runs with this
      cache's node counter and clock, and every walking ``insert`` / ``match_prefix`` reads its
      own tick (as :class:`~kvpool.sglang.radix.SGLangRadixCache` does); the counter is
      re-entrant (only the outermost call loads and saves it);
    - ``_inserted`` (the glue stand-in's bookkeeping), ``protected_size()``, and a lock of None
      (kvpool's convention for "no node") changes nothing, as in kvpool's tree."""

    def __init__(self, modules: SGLangModules, req_to_token_pool: Any, allocator: Any,
                 page_size: int, device_pool: Any, host_to_device_ratio: float,
                 eviction_policy: str = "lru", write_policy: str = "write_through",
                 load_back_threshold: int = 10, is_eagle: bool = False) -> None:  # fmt: skip
        self._depth = 0
        # the base sizes the host pool as the device pool times the ratio (no byte budget), but
        # computes a token's bytes first from MHA fields; any KV format the lifecycle draws
        # (MLA, quantized) is sized alike, so it reads them from a view, then holds the pool
        super().__init__(modules, req_to_token_pool, allocator, page_size,
                         _MHASizeView(device_pool), host_to_device_ratio, eviction_policy,
                         write_policy, load_back_threshold, is_eagle=is_eagle)  # fmt: skip
        self.token_to_kv_pool_host.device_pool = device_pool
        self.impl.kv_cache = device_pool
        self._inserted = InsertedLen()
        impl = self.impl
        for name in ("insert", "match_prefix"):
            setattr(impl, name, self._ticking(getattr(impl, name)))
        for name in _COUNTED:
            setattr(impl, name, self._counted(getattr(impl, name)))

    @contextlib.contextmanager
    def _call(self, walks: bool = False) -> Iterator[None]:
        """One SGLang call with this cache's node counter, at the current tick (advanced first
        when ``walks``); re-entrant."""
        if walks:
            self._now += 1.0
        node_cls = self._radix.TreeNode
        depth = self._depth
        self._depth = depth + 1
        if depth == 0:
            node_cls.counter = self._next_id
        try:
            with frozen_at(self._now):
                yield
        finally:
            self._depth = depth
            if depth == 0:
                self._next_id = node_cls.counter

    def _ticking(self, method: Any) -> Any:
        def call(params: Any) -> Any:
            with self._call(self._walks(params.key)):
                return method(params)

        return call

    def _counted(self, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._call():
                return method(*args, **kwargs)

        return call

    def insert(self, key: Any, value: Any = None, priority: int = 0) -> int:
        """SGLang's ``insert`` (the wrapped method ticks)."""
        skey = to_sglang_key(self.modules, key)
        params = self._params("InsertParams", key=skey, priority=priority,
                              value=None if value is None else as_index_tensor(value))  # fmt: skip
        return int(self.impl.insert(params).prefix_len)

    def match_prefix(self, key: Any) -> SGLangHiMatch:
        """SGLang's ``match_prefix`` (the wrapped method ticks)."""
        skey = to_sglang_key(self.modules, key)
        r = self.impl.match_prefix(self._params("MatchPrefixParams", key=skey))
        return SGLangHiMatch(as_index_tensor(r.device_indices), r.last_device_node,
                             r.last_host_node, int(r.host_hit_length))  # fmt: skip

    def inc_lock_ref(self, node: Any) -> int:
        return 0 if node is None else super().inc_lock_ref(node)

    def dec_lock_ref(self, node: Any) -> int:
        return 0 if node is None else super().dec_lock_ref(node)

    def protected_size(self) -> int:
        return int(self.impl.protected_size())


class SGLangHiCacheGlueManagerV0516(SGLangGlueManagerV0516):
    """The lifecycle over SGLang 0.5.16's ``HiRadixCache`` through 0.5.16's glue and scheduler
    calls (module docstring). Built as ``SGLangHiCacheGlueManagerV0516(config, modules,
    token_to_kv_pool_allocator=..., req_to_token_pool=...)`` with kvpool's SGLang adapters (or
    their factories); the tree is built over the manager's KV buffers (the host pool copies
    what the lifecycle computed)."""

    def __init__(
        self,
        config: PoolConfig,
        modules: SGLangModules,
        *,
        token_to_kv_pool_allocator: Any,
        req_to_token_pool: Any,
    ) -> None:
        if not covers_host_tier_v0516(config):
            raise InvalidArgumentError("SGLangHiCacheGlueManagerV0516 needs a 0.5.16 host tier")

        def tree(cfg: PoolConfig, pool: Any, alloc: Any) -> SGLangHiRadixLifecycle:
            # the manager's KV buffers are resolved before the tree
            return SGLangHiRadixLifecycle(modules, pool, alloc, cfg.page_size, self.kv_cache,
                                          cfg.hicache_ratio, cfg.eviction_policy,
                                          cfg.hicache_write_policy,
                                          cfg.hicache_load_back_threshold,
                                          is_eagle=cfg.is_eagle)  # fmt: skip

        super().__init__(config, modules, token_to_kv_pool_allocator=token_to_kv_pool_allocator,
                         req_to_token_pool=req_to_token_pool, tree_cache=tree)  # fmt: skip
        self._modules = modules
        self.host_glue: Counter[str] = Counter()
        """The scheduler's calls into SGLang's tree made so far (``hiradix_cache.NAME``)."""
        self.glue_calls.append(self.host_glue)
        self._loading: Req | None = None

    def _tree(self) -> SGLangHiRadixLifecycle:
        tree: Any = self.tree_cache
        return tree  # type: ignore[no-any-return]

    def _scheduler_call(self, name: str, *args: Any) -> Any:
        """SGLang's tree method ``name`` called as the scheduler calls it, counted."""
        self.host_glue[f"hiradix_cache.{name}"] += 1
        return getattr(self._tree().impl, name)(*args)

    # ----------------------------------------------------------------- admission
    def _match(self, req: Req, cow: bool, load_back: bool) -> int:
        """kvpool's match over SGLang's tree; a host hit at admission is loaded back by
        :meth:`_admit_prefix` with ``req`` as the load-back's request."""
        self._loading = req
        try:
            return super()._match(req, cow, load_back)
        finally:
            self._loading = None

    def _admit_prefix(
        self, result: MatchResult, load_back: bool = True
    ) -> tuple[torch.Tensor, Any]:
        """The prefix a request takes: the device match; at admission with a host hit, 0.5.16's
        load-back (the device match locked for the call, as ``PrefillAdder._lock_node``, around
        ``init_load_back``), its loaded slots appended and its node the new last node (the
        device match when nothing was loaded)."""
        prefix, last = result.device_indices, result.last_device_node
        hit = int(getattr(result, "host_hit_length", 0) or 0)
        best = getattr(result, "last_host_node", None)
        if not load_back or hit <= 0 or best is None or self._loading is None:
            return prefix, last
        impl = self._tree().impl
        params = self._modules.attr(_BASE, "InitLoadBackParams")(
            best_match_node=best, host_hit_length=hit, req=self._glue(self._loading)
        )
        lock = impl.inc_lock_ref(last)
        try:
            loaded, node = self._scheduler_call("init_load_back", params)
        finally:
            impl.dec_lock_ref(last, lock.to_dec_params())
        return torch.cat([as_index_tensor(prefix), as_index_tensor(loaded)]), node

    # ----------------------------------------------------------------- primitives
    def alloc_for_extend(self, reqs: Sequence[Req], seq_lens: Sequence[int]) -> torch.Tensor:
        """kvpool's checks, then the batch build's ``ready_to_load_host_cache`` (the queued
        load-backs are issued), then the glue's ``alloc_for_extend``."""
        prefix_lens, seqs = self._check_extend(reqs, seq_lens)
        self._check_capacity(self._tokens_needed(prefix_lens, seqs))
        self._scheduler_call("ready_to_load_host_cache")
        return super().alloc_for_extend(reqs, seq_lens)

    def alloc_for_decode(self, reqs: Sequence[Req]) -> torch.Tensor:
        """``update_running_batch``'s ``flush_write_through_acks`` (delivers the writes already
        done; kvpool's transfers report done only at the acknowledgement steps), then the
        glue's ``alloc_for_decode``."""
        self._scheduler_call("flush_write_through_acks")
        return super().alloc_for_decode(reqs)

    def _wait_for_loads(self) -> None:
        """The forward waits for the content of the loads in flight (copied; their transfers
        do not report done: the acknowledgement is the event check's)."""
        cc = self._tree().cache_controller
        for ack in cc.ack_load_queue:
            cc.complete(getattr(ack, "ack", ack))

    def _flush_backups(self) -> None:
        """Nothing: 0.5.16 issues writes in ``insert`` (no write queue)."""

    # ----------------------------------------------------------------- host steps
    def _events(self, queue: list[Any], num_acks: int) -> int:
        """The first ``num_acks`` transfers of ``queue`` report done, then SGLang's
        ``check_hicache_events`` delivers every acknowledgement that is ready."""
        done = min(num_acks, len(queue))
        for ack in queue[:done]:
            ack.finish_event.synchronize()
        self._scheduler_call("check_hicache_events")
        return done

    def hicache_ack_writes(self, num_acks: int) -> int:
        """The first ``num_acks`` write transfers finish; SGLang's event check delivers them
        (unlocking their nodes). Returns how many. InvalidArgumentError (nothing changed) for
        ``num_acks < 0``."""
        if num_acks < 0:
            raise InvalidArgumentError(f"num_acks must be >= 0, got {num_acks}")
        return self._events(self._tree().cache_controller.ack_write_queue, num_acks)

    def hicache_ack_loads(self, num_acks: int) -> int:
        """Loads queued but not issued are issued (``ready_to_load_host_cache``), the first
        ``num_acks`` load transfers finish and SGLang's event check delivers them (unlocking the
        loaded nodes). Returns how many. InvalidArgumentError (nothing changed) for
        ``num_acks < 0``."""
        if num_acks < 0:
            raise InvalidArgumentError(f"num_acks must be >= 0, got {num_acks}")
        self._scheduler_call("ready_to_load_host_cache")
        return self._events(self._tree().cache_controller.ack_load_queue, num_acks)


__all__ = [
    "SGLangHiCacheGlueManagerV0516",
    "SGLangHiRadixLifecycle",
]

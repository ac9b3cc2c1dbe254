"""``SGLangHiCacheGlueManager``: SGLang 0.5.23's scheduler glue with the host tier inside the
unified cache (``--enable-hierarchical-cache``).

:class:`~kvpool.sglang.glue_manager.SGLangGlueManager` over SGLang's own ``UnifiedRadixCache``
with ``init_hicache``'s host tier attached (:class:`~kvpool.sglang.unified_hicache.
SGLangUnifiedHiCache`, its host pool backing the manager's KV buffers, so transfers copy what
the lifecycle computed). The memory steps are the calls SGLang 0.5.23's scheduler makes
(specs/host_tier.md, "The host tier inside SGLang 0.5.23's request lifecycle"):

==============================  ===========================================================
kvpool step                     SGLang called
==============================  ===========================================================
``match_prefix`` (admission)    ``common.match_kv_cache`` (device prefix, ``host_hit_length``,
                                ``best_match_node``); with a host hit, the admission's
                                load-back: the matched path pinned (``lock`` and
                                ``inc_host_lock_ref`` of ``best_match_node``, as the
                                scheduler's ``_lock_node(..., lock_host=True)``) around
                                ``init_load_back(InitLoadBackParams(best_match_node,
                                host_hit_length, req=req))``; the request then takes
                                ``prefix_len + host_loaded_length`` tokens and the loaded node
``extend``                      ``ready_to_load_host_cache`` (the batch build), the glue's
                                ``alloc_for_extend``; the forward waits for the loads' content
                                (their acknowledgements stay pending); a chunk's
                                ``checkpoint_kv_cache``; ``flush_pending_backups`` after the
                                batch (the scheduler's call after ``process_batch_result``)
``finish``                      ``common.release_kv_cache(checkpoint=True)`` per request (the
                                checkpoint's insert queues the write-through backups), then
                                ``flush_pending_backups``
``hicache_ack_writes(k)``       the first ``k`` write transfers report done, then
                                ``check_hicache_events`` (the scheduler's per-iteration event
                                check: it counts the ready acknowledgements and delivers them)
``hicache_ack_loads(k)``        ``ready_to_load_host_cache`` (loads admitted but not yet
                                issued), the first ``k`` load transfers report done, then
                                ``check_hicache_events``
==============================  ===========================================================

What kvpool keeps (as the base glue manager does): which requests form a batch, admission
(kvpool's capacity rule; SGLang's prefill budget, which also counts the host-hit tokens a
load-back will need, is scheduler policy over the same calls), the request's one lock.
A configuration the adapter does not cover (storage prefetches, layer-wise loading) runs
kvpool's lifecycle over SGLang's components (:func:`covers_host_tier`).
"""

from __future__ import annotations

from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError
from kvpool.optimized.req import Req
from kvpool.sglang.cache_req import as_prefix
from kvpool.sglang.glue import GlueKv, GlueReq
from kvpool.sglang.glue_manager import SGLangGlueManager
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.unified_hicache import SGLangUnifiedHiCache


def covers_host_tier(config: PoolConfig) -> bool:
    """Whether :class:`SGLangHiCacheGlueManager` drives this host-tier configuration: the
    unified host tier (``Rules.hicache_host_tier == "unified"``), no storage prefetches (0.5.16's
    flow), no layer-wise loading, no hybrid model."""
    return (
        config.enable_hierarchical_cache
        and config.rules.hicache_host_tier == "unified"
        and not config.hicache_storage
        and not config.layerwise_loading
        and config.mamba_slots is None
        and not config.disable_radix_cache
    )


class HiGlueKv(GlueKv):
    """``req.kv`` as a load-back reads it too: no Mamba slot to restore into."""

    __slots__ = ()

    @property
    def mamba_pool_idx(self) -> None:
        return None


class HiGlueReq(GlueReq):
    """A kvpool request as SGLang's glue and its load-back see it (:class:`~kvpool.sglang.
    glue.GlueReq`; ``kv`` is a :class:`HiGlueKv`)."""

    __slots__ = ()

    @property
    def kv(self) -> HiGlueKv:
        return HiGlueKv(self)


class SGLangHiCacheGlueManager(SGLangGlueManager):
    """The lifecycle over SGLang's unified cache with its host tier, through SGLang's glue
    (module docstring). Built as ``SGLangHiCacheGlueManager(config, modules,
    token_to_kv_pool_allocator=..., req_to_token_pool=..., tree_core="rust")``."""

    def __init__(
        self,
        config: PoolConfig,
        modules: SGLangModules,
        *,
        token_to_kv_pool_allocator: Any,
        req_to_token_pool: Any,
        tree_core: str = "rust",
    ) -> None:
        def tree(cfg: PoolConfig, pool: Any, alloc: Any) -> SGLangUnifiedHiCache:
            # the manager's KV buffers exist by now (resolved before the tree): the host pool
            # copies them
            return SGLangUnifiedHiCache(modules, pool, alloc, cfg.page_size, self.kv_cache,
                                        cfg.hicache_ratio, cfg.eviction_policy,
                                        cfg.hicache_write_policy,
                                        cfg.hicache_load_back_threshold,
                                        tree_core, is_eagle=cfg.is_eagle)  # fmt: skip

        super().__init__(
            config,
            modules,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
            req_to_token_pool=req_to_token_pool,
            tree_cache=tree,
        )

    def _glue(self, req: Req) -> HiGlueReq:
        tree: Any = self.tree_cache
        return HiGlueReq(req, tree._inserted, tree._tree_lock, tree.node_ref)

    # ----------------------------------------------------------------- admission
    def _match(self, req: Req, cow: bool, load_back: bool) -> int:
        """``match_kv_cache``, then, at admission (``load_back``) with a host hit, the
        scheduler's load-back (module docstring); ``extend``'s own match loads nothing."""
        if self._restoring_session(req) is not None:
            return super()._match(req, cow, load_back)
        tree: Any = self.tree_cache
        glue = self._glue(req)
        tokens = glue.full_untruncated_fill_ids
        old = req.last_node if req.matched else None
        cap = glue._compute_max_prefix_len(len(tokens))
        self._common.match_kv_cache(glue, tree.impl, tokens, max_prefix_len=cap)
        if load_back and int(glue.matched.get("host_hit_length", 0)) > 0:
            self._load_back(glue)
        last = req.last_node
        prefix = (
            tree.impl.prefix_device_indices(glue)
            if glue.prefix_len
            else torch.empty((0,), dtype=torch.int64)
        )
        tree.inc_lock_ref(last)
        if old is not None:
            tree.dec_lock_ref(old)
        req.prefix_indices = as_prefix(prefix, req.prefix_indices)
        req.last_node = last
        req.matched = True
        return len(req.prefix_indices)

    def _load_back(self, glue: Any) -> None:
        """The admission's load-back of a host hit, as SGLang's ``PrefillAdder`` makes it: the
        best match pinned on device and host around ``init_load_back``; the request's prefix
        grows by the loaded tokens and its last node becomes the loaded one (none loaded: it
        stays the device match)."""
        tree: Any = self.tree_cache
        impl = tree.impl
        best = int(glue.matched["best_match_node"])
        host_pin = impl.inc_host_lock_ref(best).to_dec_params()
        try:
            lock = impl.lock(best)
            try:
                params = tree._p("InitLoadBackParams", best_match_node=best,
                                 host_hit_length=int(glue.matched["host_hit_length"]),
                                 req=glue)  # fmt: skip
                with tree._call():
                    loaded = impl.init_load_back(params)
            finally:
                impl.unlock(lock)
        finally:
            impl.dec_host_lock_ref(best, host_pin)
        count, last = loaded
        glue.last_node = last
        glue.prefix_len = glue.prefix_len + int(count)

    # ----------------------------------------------------------------- host steps
    def _wait_for_loads(self) -> None:
        """The batch build's ``ready_to_load_host_cache``, then the forward waits for the
        loads' content (copied; their transfers do not report done: the acknowledgement is
        the event check's, :meth:`hicache_ack_loads`)."""
        tree: Any = self.tree_cache
        with tree._call():
            tree.impl.ready_to_load_host_cache()
        cc = tree.cache_controller
        for ack in cc.ack_load_queue:
            cc.complete(getattr(ack, "ack", ack))

    def _flush_backups(self) -> None:
        """The scheduler's ``flush_pending_backups`` after a batch."""
        tree: Any = self.tree_cache
        with tree._call():
            tree.impl.flush_pending_backups()

    def _events(self, queue: list[Any], num_acks: int) -> int:
        """The first ``num_acks`` transfers of ``queue`` report done (their content copied),
        then SGLang's ``check_hicache_events`` delivers every ready acknowledgement."""
        tree: Any = self.tree_cache
        done = min(num_acks, len(queue))
        for ack in queue[:done]:
            ack.finish_event.synchronize()
        with tree._call():
            tree.impl.check_hicache_events()
        return done

    def hicache_ack_writes(self, num_acks: int) -> int:
        """The first ``num_acks`` write transfers finish; SGLang's event check delivers them
        (unlocking their nodes). Returns how many. InvalidArgumentError (nothing changed) for
        ``num_acks < 0``."""
        if num_acks < 0:
            raise InvalidArgumentError(f"num_acks must be >= 0, got {num_acks}")
        tree: Any = self.tree_cache
        return self._events(tree.cache_controller.ack_write_queue, num_acks)

    def hicache_ack_loads(self, num_acks: int) -> int:
        """Loads admitted but not issued are issued (``ready_to_load_host_cache``), the first
        ``num_acks`` load transfers finish and SGLang's event check delivers them (unlocking
        the loaded nodes). Returns how many. InvalidArgumentError (nothing changed) for
        ``num_acks < 0``."""
        if num_acks < 0:
            raise InvalidArgumentError(f"num_acks must be >= 0, got {num_acks}")
        tree: Any = self.tree_cache
        with tree._call():
            tree.impl.ready_to_load_host_cache()
        return self._events(tree.cache_controller.ack_load_queue, num_acks)


HOST_GLUE_STEPS = frozenset({"hicache_ack_writes", "hicache_ack_loads"})
"""The host-tier steps :class:`SGLangHiCacheGlueManager` makes as SGLang's scheduler does (its
per-iteration ``check_hicache_events``), reachable besides the base glue steps
(:func:`kvpool.sglang.glue_manager.reachability`'s ``extra``)."""


__all__ = [
    "HOST_GLUE_STEPS",
    "SGLangHiCacheGlueManager",
    "covers_host_tier",
]

"""SGLang 0.5.16's scheduler memory glue in kvpool's lifecycle: stand-ins and the manager.

SGLang 0.5.16 already routes its scheduler's memory work through ``mem_cache/allocation.py``
(``alloc_for_extend``, ``alloc_for_decode``, ``alloc_for_spec_decode``, ``alloc_req_slots``,
``alloc_token_slots``, the paged helpers, ``write_cache_indices``) and ``mem_cache/common.py``
(``release_kv_cache``, ``maybe_cache_unfinished_req``, ``evict_from_tree_cache``), but with
another shape than 0.5.23's (:mod:`kvpool.sglang.glue`):

- the request keeps ``req_pool_idx``, ``kv_committed_len`` and ``cache_protected_len`` itself;
  ``req.kv`` is an optional ``ReqKvInfo`` (``kv_allocated_len``, ``swa_evicted_seqlen``) that
  ``alloc_for_extend`` creates and ``release_kv_cache`` drops (None), not a record that is
  always there;
- there is no ``match_kv_cache`` / ``checkpoint_kv_cache``: the match is the request's own
  ``init_next_round_input`` (``tree.match_prefix``, a method of ``schedule_batch.Req``, not
  glue), a chunk boundary is ``maybe_cache_unfinished_req(req, tree, chunked=True)`` and a
  release is ``release_kv_cache(req, tree, is_insert)``, which calls the legacy
  ``RadixCache.cache_finished_req(req, is_insert, kv_len_to_handle=...)``, frees the
  over-allocation with ``allocator.free`` and the row;
- the glue reads the server's settings through ``runtime_context.get_server_args()``
  (``page_size``, ``speculative_algorithm``, ``strip_thinking_cache``, ``attention_backend``,
  ``dcp_size``) instead of 0.5.23's ``get_spec()`` / ``get_serving()``.

:class:`SGLangGlueManagerV0516` is :class:`~kvpool.sglang.glue_manager.SGLangGlueManager`
(whose ``alloc_for_extend``, ``alloc_for_decode`` and EAGLE v2 reserve call the same-named glue
of either release) with 0.5.16's stand-ins, release and chunk calls, over 0.5.16's own
allocator, ``ReqToTokenPool`` and legacy ``RadixCache`` (the tree 0.5.16's registry builds for
a full-attention model). The stand-ins expose exactly the fields 0.5.16's glue (and the tree
methods it calls) read or write; any other attribute raises AttributeError:

=====================================  ===================================================
SGLang 0.5.16 reads / writes           kvpool field
=====================================  ===================================================
``req_pool_idx`` (read / write)        ``req_pool_idx`` (``ReqToTokenPool.alloc`` / ``free``)
``inflight_middle_chunks``             ``is_chunked`` (``ReqToTokenPool.alloc``'s reuse check)
``kv_committed_len``                   ``kv_committed_len``
``effective_kv_committed_len()``       ``kv_committed_len`` (``strip_thinking_cache`` off)
``kv`` (read)                          None while the request holds no SGLang KV record, else
                                       a view whose ``kv_allocated_len`` (read / write) is
                                       kvpool's ``kv_allocated_len``
``kv = ReqKvInfo(...)``                SGLang's own ``ReqKvInfo`` (loaded from
                                       ``schedule_batch.py``): its ``kv_allocated_len``
                                       becomes kvpool's, the request now holds a record
``kv = None``                          the record is dropped
``prefix_indices``, the tree fields    as :class:`~kvpool.sglang.cache_req.CacheReq`
=====================================  ===================================================

The record is kept per kvpool request (:class:`KvRecords`): SGLang creates it at the first
extend and drops it at release, and asserts that it exists exactly while the request holds a
row, so kvpool's lifecycle is checked to agree.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError, InvariantViolation
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.optimized.radix.chunk_cache import ChunkCache
from kvpool.optimized.req import Req
from kvpool.rules import Rules
from kvpool.sglang.cache_req import CacheReq, InsertedLen
from kvpool.sglang.glue_manager import GLUE_MODULES, SGLangGlueManager
from kvpool.sglang.loader import GLUE_MARKER, UNIFIED_MARKER, SGLangModules


def has_glue_v0516(modules: SGLangModules) -> bool:
    """Whether ``modules`` is a release with 0.5.16's glue shape: ``mem_cache/allocation.py``
    without the unified cache's tree cores (the loader then loads the glue for real)."""
    names = modules.source.names(GLUE_MARKER.rpartition("/")[0] + "/")
    unified = modules.source.names(UNIFIED_MARKER.rpartition("/")[0] + "/")
    return GLUE_MARKER in names and UNIFIED_MARKER not in unified


def covers_host_tier_v0516(config: PoolConfig) -> bool:
    """Whether :class:`~kvpool.sglang.glue_v0516_host.SGLangHiCacheGlueManagerV0516` drives this
    configuration: the host tier as 0.5.16's ``HiRadixCache`` runs it
    (``Rules.hicache_host_tier == "hiradix"``), the radix cache on, no storage prefetches, no
    layer-wise loading, no hybrid model (0.5.16's registry builds its own ``UnifiedRadixCache``
    for a hybrid model with a host tier, which kvpool does not load)."""
    return (
        config.enable_hierarchical_cache
        and config.rules.hicache_host_tier == "hiradix"
        and not config.hicache_storage
        and not config.layerwise_loading
        and config.mamba_slots is None
        and not config.disable_radix_cache
    )


def covers_mamba_v0516(config: PoolConfig) -> bool:
    """Whether :class:`~kvpool.sglang.glue_v0516_mamba.SGLangMambaGlueManagerV0516` drives this
    configuration: a hybrid model, the radix cache off (0.5.16's ``ChunkCache``), no host tier,
    no layer-wise loading."""
    return (
        config.mamba_slots is not None
        and config.disable_radix_cache
        and not config.enable_hierarchical_cache
        and not config.layerwise_loading
    )


def covers_mamba_radix_v0516(config: PoolConfig) -> bool:
    """Whether :class:`~kvpool.sglang.glue_v0516_mamba.SGLangMambaRadixGlueManagerV0516` drives
    this configuration: a hybrid model with the radix cache on (0.5.16's FULL+MAMBA
    ``UnifiedRadixCache``) under the rules that pair kvpool's model of that tree with 0.5.16's
    release (``Rules.mamba_tree == "unified"``, ``release_path == "finished_req"``), no host
    tier, no layer-wise loading."""
    return (
        config.mamba_slots is not None
        and not config.disable_radix_cache
        and config.rules.mamba_tree == "unified"
        and config.rules.release_path == "finished_req"
        and not config.enable_hierarchical_cache
        and not config.layerwise_loading
    )


MAMBA_TREE_V0516 = (
    "0.5.16's glue over its FULL+MAMBA UnifiedRadixCache drives a hybrid model with the radix "
    "cache on under 0.5.16's rules (mamba_tree 'unified', release_path 'finished_req') without "
    "layer-wise loading or a host tier; kvpool's lifecycle runs this one over SGLang's token "
    "allocator"
)
"""Why a hybrid configuration with the radix cache on is not driven through 0.5.16's glue
(:func:`covers_mamba_radix_v0516` says no; the reachability line of its failures)."""


def glue_covers_v0516(config: PoolConfig) -> bool:
    """Whether 0.5.16's glue drives this lifecycle configuration: a full-attention model without
    layer-wise loading, over its legacy ``RadixCache`` or, with the radix cache off, its
    ``ChunkCache`` (:class:`SGLangChunkGlueManagerV0516`); kvpool's lifecycle over SGLang's
    components runs layer-wise loading. The host
    tier and hybrid Mamba families have their own managers: see :func:`covers_host_tier_v0516`,
    :func:`covers_mamba_v0516` and :func:`covers_mamba_radix_v0516`."""
    if config.enable_hierarchical_cache:
        return covers_host_tier_v0516(config)
    if config.mamba_slots is not None:
        return covers_mamba_v0516(config) or covers_mamba_radix_v0516(config)
    return not (
        config.enable_hierarchical_cache
        or config.mamba_slots is not None
        or config.layerwise_loading
    )


class _Range:
    """``req.extend_range`` as ``ChunkCache.cache_unfinished_req`` reads it: ``end`` only."""

    __slots__ = ("end",)

    def __init__(self, end: int) -> None:
        self.end = end


def _property(obj: object, name: str) -> property:
    prop = getattr(type(obj), name, None)
    if not isinstance(prop, property) or prop.fset is None:
        raise AttributeError(f"SGLang wrote {name!r}, which kvpool's request does not map")
    return prop


class KvRecords:
    """Which kvpool requests hold an SGLang 0.5.16 KV record (``req.kv`` not None): added when
    SGLang's ``alloc_for_extend`` sets one, dropped when ``release_kv_cache`` sets None (and
    when the request goes away)."""

    def __init__(self) -> None:
        self._held: weakref.WeakSet[Any] = weakref.WeakSet()

    def holds(self, req: Any) -> bool:
        return req in self._held

    def add(self, req: Any) -> None:
        self._held.add(req)

    def drop(self, req: Any) -> None:
        self._held.discard(req)


class GlueKvV0516:
    """0.5.16's ``req.kv`` (``ReqKvInfo``) of a :class:`GlueReqV0516` holding a record:
    ``kv_allocated_len`` only (``swa_evicted_seqlen`` is read by the sliding-window glue
    alone)."""

    __slots__ = ("_owner",)
    _owner: GlueReqV0516

    def __init__(self, owner: GlueReqV0516) -> None:
        object.__setattr__(self, "_owner", owner)

    def __setattr__(self, name: str, value: Any) -> None:
        _property(self, name).fset(self, value)  # type: ignore[misc]

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"SGLang read kv.{name!r}, which kvpool's request does not map")

    @property
    def kv_allocated_len(self) -> int:
        return int(self._owner.req.kv_allocated_len)

    @kv_allocated_len.setter
    def kv_allocated_len(self, value: int) -> None:
        self._owner.req.kv_allocated_len = int(value)


class GlueReqV0516(CacheReq):
    """A kvpool request as SGLang 0.5.16's memory glue sees it (see the module docstring)."""

    __slots__ = ("_records",)
    _records: KvRecords

    def __init__(self, req: Any, records: KvRecords, *args: Any) -> None:
        super().__init__(req, *args)
        object.__setattr__(self, "_records", records)

    def __setattr__(self, name: str, value: Any) -> None:
        _property(self, name).fset(self, value)  # type: ignore[misc]

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"SGLang read {name!r}, which kvpool's request does not map")

    @property
    def req_pool_idx(self) -> int | None:
        value = self.req.req_pool_idx
        return None if value is None else int(value)

    @req_pool_idx.setter
    def req_pool_idx(self, value: int | None) -> None:
        self.req.req_pool_idx = None if value is None else int(value)

    @property
    def inflight_middle_chunks(self) -> int:
        return int(self.req.is_chunked)

    @property
    def kv_committed_len(self) -> int:
        return int(self.req.kv_committed_len)

    def effective_kv_committed_len(self) -> int:
        """The committed length: thinking tokens are cached (``strip_thinking_cache`` off), so
        SGLang's method returns ``kv_committed_len`` unchanged."""
        return int(self.req.kv_committed_len)

    @property  # type: ignore[override]
    def kv(self) -> GlueKvV0516 | None:
        return GlueKvV0516(self) if self._records.holds(self.req) else None

    @kv.setter
    def kv(self, value: Any) -> None:
        """SGLang's ``ReqKvInfo`` (the first extend) or None (the release)."""
        if value is None:
            self._records.drop(self.req)
            return
        if int(value.swa_evicted_seqlen) != 0:
            raise AttributeError("SGLang wrote kv.swa_evicted_seqlen; no sliding window here")
        self.req.kv_allocated_len = int(value.kv_allocated_len)
        self._records.add(self.req)


class ChunkGlueReqV0516(GlueReqV0516):
    """A kvpool request as SGLang 0.5.16's glue and its ``ChunkCache`` (the tree of
    ``--disable-radix-cache``) see it: :class:`GlueReqV0516` plus ``extend_range`` (read), whose
    ``end`` is ``len(fill_ids)`` (tokens: where the prefill chunk ends)."""

    __slots__ = ()

    @property
    def extend_range(self) -> _Range:
        return _Range(len(self.req.fill_ids))


class _ModelConfig:
    __slots__ = ()
    is_encoder_decoder = False


class GlueBatchV0516:
    """The ``ScheduleBatch`` fields 0.5.16's allocation glue reads (an unknown one raises)."""

    __slots__ = (
        "device",
        "extend_lens",
        "extend_num_tokens",
        "model_config",
        "prefix_lens",
        "req_pool_indices",
        "req_to_token_pool",
        "reqs",
        "seq_lens",
        "seq_lens_cpu",
        "token_to_kv_pool_allocator",
        "tree_cache",
    )

    def __init__(self, reqs: list[GlueReqV0516], req_to_token_pool: Any, tree_cache: Any) -> None:
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.tree_cache = tree_cache
        # read only to ask for the DeepSeek-V4 state lengths, which this allocator has none of
        self.token_to_kv_pool_allocator = tree_cache.token_to_kv_pool_allocator
        self.device = "cpu"
        self.model_config = _ModelConfig()

    def maybe_evict_swa(self) -> None:
        """No sliding window on this path."""

    def is_dllm(self) -> bool:
        return False

    def for_extend(self, prefix_lens: list[int], seq_lens: list[int]) -> GlueBatchV0516:
        """The prefill batch's lengths (tokens), as ``ScheduleBatch.prepare_for_extend``."""
        self.prefix_lens = list(prefix_lens)
        self.extend_lens = [s - p for p, s in zip(prefix_lens, seq_lens, strict=True)]
        self.extend_num_tokens = sum(self.extend_lens)
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
        self.seq_lens_cpu = self.seq_lens.clone()
        return self

    def for_decode(self, rows: list[int], seq_lens: list[int]) -> GlueBatchV0516:
        """The decode batch: each request's row and length before its new token."""
        self.req_pool_indices = torch.tensor(rows, dtype=torch.int64)
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
        self.seq_lens_cpu = self.seq_lens.clone()
        return self


class GlueServerArgs:
    """``get_server_args()`` as 0.5.16's glue reads it (an unknown field raises): the server's
    page size (the manager's, set before each glue call), speculative decoding on (kvpool draws
    EAGLE steps, whose reserve leaves over-allocated slots that a release frees), thinking
    tokens kept, the ``torch_native`` attention backend (SGLang then writes rows and reads
    ``last_loc`` in torch, not with its Triton writers: the same slots), no decode context
    parallelism."""

    __slots__ = ("page_size",)
    speculative_algorithm = "EAGLE"
    strip_thinking_cache = False
    attention_backend = "torch_native"
    dcp_size = 1

    def __init__(self) -> None:
        self.page_size = 1


_ARGS = "__kvpool_server_args__"


def install_server_args(modules: list[Any]) -> GlueServerArgs:
    """The :class:`GlueServerArgs` the glue ``modules`` read through their ``get_server_args``
    (bound from the stubbed ``runtime_context`` at import); one object per process, installed
    once."""
    known: GlueServerArgs | None = vars(modules[0]).get(_ARGS)
    if known is not None:
        return known
    args = GlueServerArgs()
    for module in modules:
        module.__dict__["get_server_args"] = lambda: args
        module.__dict__[_ARGS] = args
    return args


class SGLangGlueManagerV0516(SGLangGlueManager):
    """The lifecycle over SGLang 0.5.16's components with 0.5.16's glue (module docstring):

    =============================  ==========================================================
    kvpool step                    SGLang 0.5.16 glue called
    =============================  ==========================================================
    ``match_prefix``               none: kvpool's match over SGLang's ``RadixCache.
                                   match_prefix`` (0.5.16's ``init_next_round_input`` makes
                                   the same tree call; the scheduler then locks the node)
    ``extend`` (admission)         ``allocation.alloc_for_extend(batch)``: ``alloc_req_slots``,
                                   ``alloc_token_slots`` or ``alloc_paged_token_slots_extend``
                                   (eviction through ``evict_from_tree_cache``),
                                   ``write_cache_indices``, the ``ReqKvInfo`` record
    a chunk boundary               ``common.maybe_cache_unfinished_req(req, tree,
                                   chunked=True)`` (the tree's ``cache_unfinished_req``)
    ``decode``                     ``allocation.alloc_for_decode(batch, 1)``
    ``spec_step`` (EAGLE v2)       ``allocation.alloc_for_spec_decode``
    ``finish``                     ``common.release_kv_cache(req, tree, is_insert=True)``
                                   inside the allocator's free group
    ``abort`` / ``retract``        ``common.release_kv_cache(req, tree, is_insert=False)``
    =============================  ==========================================================
    """

    glue_writes_committed = False  # 0.5.16's allocation glue leaves the committed length

    def __init__(
        self,
        config: PoolConfig,
        modules: SGLangModules,
        *,
        token_to_kv_pool_allocator: Any,
        req_to_token_pool: Any,
        tree_cache: Any,
    ) -> None:
        self._server_args = install_server_args(
            [modules.module(dotted) for dotted in GLUE_MODULES.values()]
        )
        super().__init__(
            config,
            modules,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
            req_to_token_pool=req_to_token_pool,
            tree_cache=tree_cache,
        )
        self._records = KvRecords()

    def _bind(self) -> None:
        """Before a glue call: the server's page size is this manager's."""
        self._server_args.page_size = self.page_size

    # ----------------------------------------------------------------- stand-ins
    def _glue(self, req: Req) -> GlueReqV0516:  # type: ignore[override]
        self._bind()
        tree: Any = self.tree_cache
        return GlueReqV0516(req, self._records, tree._inserted)

    def _glue_batch(self, reqs: Any) -> GlueBatchV0516:  # type: ignore[override]
        pool: Any = self.req_to_token_pool
        tree: Any = self.tree_cache
        return GlueBatchV0516([self._glue(r) for r in reqs], pool.impl, tree.impl)

    def _match(self, req: Req, cow: bool, load_back: bool) -> int:
        """kvpool's match over SGLang's tree (0.5.16 has no match glue: see the class
        docstring)."""
        return MemoryManager._match(self, req, cow, load_back)

    # ----------------------------------------------------------------- release
    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """SGLang 0.5.16's ``release_kv_cache(req, tree, is_insert)``: the tree's
        ``cache_finished_req`` (insert or free the committed tokens, free the unaligned tail,
        unlock), the over-allocation ``[ceil_align(committed), allocated)`` freed, the row
        freed, the record dropped (``INV-LENGTHS`` if SGLang keeps it); then kvpool forgets
        the request's pool fields. InvalidArgumentError (nothing changed) without a row."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        tree: Any = self.tree_cache
        self._common.release_kv_cache(self._glue(req), tree.impl, is_insert=is_insert)
        if self._records.holds(req):  # kvpool forgets it next: the glue's part is checked
            raise InvariantViolation(
                "INV-LENGTHS",
                f"SGLang's release_kv_cache kept request {req.rid!r}'s KV record (req.kv) "
                "after giving its row back",
            )
        tree._inserted.forget(req)
        req.reset_kv_fields()

    def _checkpoint_chunk(self, req: Req, chunked: bool = False, row_read: Any = None) -> None:
        """A chunk boundary: SGLang's ``maybe_cache_unfinished_req(req, tree, chunked=True)``;
        the tree sets ``prefix_indices``, ``cache_protected_len`` and ``last_node`` itself."""
        tree: Any = self.tree_cache
        self._common.maybe_cache_unfinished_req(self._glue(req), tree.impl, chunked=True)


class SGLangChunkCacheV0516(ChunkCache):
    """SGLang 0.5.16's ``ChunkCache`` (``impl``) as the lifecycle's tree: kvpool's twin
    ``ChunkCache`` answers the lifecycle's own calls (no match, no locks, nothing evictable,
    the disabled snapshot), which are SGLang's answers too (``match_prefix`` empty,
    ``evict`` / locks no-ops, sizes 0); the glue calls ``impl``'s ``cache_finished_req`` /
    ``cache_unfinished_req``."""

    def __init__(self, modules: SGLangModules, req_to_token_pool: Any,
                 token_to_kv_pool_allocator: Any, page_size: int,
                 eviction_policy: str = "lru", *, rules: Rules | None = None) -> None:  # fmt: skip
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size,
                         eviction_policy, rules=rules)  # fmt: skip
        params = modules.attr("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")(
            disable=True,
            req_to_token_pool=getattr(req_to_token_pool, "impl", req_to_token_pool),
            token_to_kv_pool_allocator=getattr(
                token_to_kv_pool_allocator, "impl", token_to_kv_pool_allocator
            ),
            page_size=page_size,
            eviction_policy=eviction_policy,
        )
        self.impl: Any = modules.attr("sglang.srt.mem_cache.chunk_cache", "ChunkCache")(params)
        self._inserted = InsertedLen()


class SGLangChunkGlueManagerV0516(SGLangGlueManagerV0516):
    """The glue lifecycle of a full-attention model with the radix cache off over SGLang 0.5.16:
    :class:`SGLangGlueManagerV0516` over the tree 0.5.16's registry builds for
    ``--disable-radix-cache`` (``mem_cache/registry.py``: ``ChunkCache``), so a chunk boundary
    is ``ChunkCache.cache_unfinished_req`` (``prefix_indices = row[:extend_range.end]``) and a
    release ``ChunkCache.cache_finished_req`` (frees ``row[cache_protected_len:committed]``)."""

    def __init__(self, config: PoolConfig, modules: SGLangModules, **components: Any) -> None:
        if not config.disable_radix_cache:
            raise InvalidArgumentError(f"{type(self).__name__} drives the radix cache off only")

        def tree(cfg: PoolConfig, pool: Any, alloc: Any) -> SGLangChunkCacheV0516:
            return SGLangChunkCacheV0516(modules, pool, alloc, cfg.page_size,
                                         cfg.eviction_policy, rules=cfg.rules)  # fmt: skip

        super().__init__(config, modules, tree_cache=tree, **components)

    def _glue(self, req: Req) -> ChunkGlueReqV0516:  # type: ignore[override]
        self._bind()
        tree: Any = self.tree_cache
        return ChunkGlueReqV0516(req, self._records, tree._inserted)


def with_glue_v0516(built: Any, manager: Any) -> Any:
    """``built`` (0.5.16's :class:`~kvpool.testing.bundle.Implementation`) with ``manager`` (the
    factory of :class:`SGLangGlueManagerV0516`, falling back to kvpool's lifecycle where
    :func:`glue_covers_v0516` says no), its reachability lines and a ``-glue`` label. The
    manager runs hybrid Mamba lifecycles (:mod:`kvpool.sglang.glue_v0516_mamba`, the radix
    cache off or on; layer-wise loading: kvpool's lifecycle, :data:`MAMBA_TREE_V0516`)."""
    import dataclasses

    from kvpool.sglang.glue_hicache import HOST_GLUE_STEPS
    from kvpool.sglang.glue_manager import reachability

    def reach(config: PoolConfig, ops: Any) -> str:
        hybrid_radix = config.mamba_slots is not None and not config.disable_radix_cache
        if hybrid_radix and not covers_mamba_radix_v0516(config):
            return f"direct only: {MAMBA_TREE_V0516}"
        extra = HOST_GLUE_STEPS if config.enable_hierarchical_cache else frozenset()
        return reachability(config, ops, covered=glue_covers_v0516(config), extra=extra)

    return dataclasses.replace(built, manager=manager, manager_runs_hybrid=True,
                               manager_models_eagle=True, manager_models_stops=True,
                               reachability=reach,
                               label=f"{built.label}-glue")  # fmt: skip


__all__ = [
    "MAMBA_TREE_V0516",
    "ChunkGlueReqV0516",
    "GlueBatchV0516",
    "GlueKvV0516",
    "GlueReqV0516",
    "GlueServerArgs",
    "KvRecords",
    "SGLangChunkCacheV0516",
    "SGLangChunkGlueManagerV0516",
    "SGLangGlueManagerV0516",
    "covers_host_tier_v0516",
    "covers_mamba_radix_v0516",
    "covers_mamba_v0516",
    "glue_covers_v0516",
    "has_glue_v0516",
    "install_server_args",
    "with_glue_v0516",
]

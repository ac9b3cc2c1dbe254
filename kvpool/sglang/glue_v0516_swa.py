"""SGLang 0.5.16's scheduler glue for a hybrid sliding-window model with the radix cache
disabled: kvpool's SWA lifecycle whose memory steps are 0.5.16's own glue, over 0.5.16's SWA
allocator, ``ReqToTokenPool`` and ``SWAChunkCache``.

For ``--disable-radix-cache`` (with chunked prefill, SGLang's default) on a hybrid SWA model,
0.5.16's ``registry.default_radix_cache_factory`` builds ``chunk_cache.SWAChunkCache``; the
window slides in ``ScheduleBatch.maybe_evict_swa`` / ``_evict_swa``, which call
``common.free_swa_out_of_window_slots``. :class:`SGLangSWAGlueManagerV0516` runs them all as
SGLang wrote them:

=============================  ==========================================================
kvpool step                    SGLang 0.5.16 code called
=============================  ==========================================================
``extend`` (admission)         ``allocation.alloc_for_extend(batch)``: first
                               ``batch.maybe_evict_swa()`` (a later prefill chunk's window
                               slides at its prefix length), then as for full attention
                               (:mod:`kvpool.sglang.glue_v0516`)
a chunk boundary               ``common.maybe_cache_unfinished_req(req, tree, chunked=True)``
                               (``SWAChunkCache.cache_unfinished_req``)
``decode``                     ``allocation.alloc_for_decode(batch, 1)``: first
                               ``maybe_evict_swa`` (each request decoded before slides at its
                               committed length); then ``decode_batch_idx`` advances, as
                               ``prepare_for_decode`` does
``spec_step`` (EAGLE v2)       ``maybe_evict_swa`` on the decode batch, ``decode_batch_idx``
                               advances, then ``alloc_for_spec_decode``
                               (``eagle_prepare_for_decode``'s order)
``finish`` / ``abort`` /       ``common.release_kv_cache(req, tree, is_insert)``
``retract``                    (``ChunkCache.cache_finished_req``: the SWA allocator's
                               ``free``, which skips slots whose SWA slot slid away)
=============================  ==========================================================

SGLang's own code, not kvpool's copy of it: ``maybe_evict_swa`` and ``_evict_swa`` are compiled
from the release's ``managers/schedule_batch.py`` (the loader stubs that module) with
``maybe_evict_dsv4_state`` from ``hardware_backend/npu/dsv4/dsv4_common_hooks.py`` (it returns
at once: the allocator has no compressed-state pools) and the ``envs`` of the release's
``environ.py``; ``SWAChunkCache`` comes from its ``mem_cache/chunk_cache.py``. Where the loader
does not execute those files for real, they are executed here, privately
(:func:`sglang_module`). The ``ScheduleBatch`` and ``Req`` stand-ins expose exactly the fields
that code reads (any other raises AttributeError):

=====================================  ===================================================
SGLang 0.5.16 reads / writes           kvpool field
=====================================  ===================================================
``seqlen``                             ``kv_committed_len + 1`` (the sampled token whose KV
                                       the step computes is in SGLang's ``output_ids``)
``decode_batch_idx``                   decode steps since admission (:class:`SWAReqState`)
``kv.swa_evicted_seqlen`` (r / w)      the request's SWA cursor (:class:`SWAReqState`)
``extend_range.end``                   ``len(fill_ids)`` (``cache_unfinished_req``)
``swa_evict_floor``                    unmapped: SGLang reads it with ``getattr(req,
                                       "swa_evict_floor", 0)``, so the shield is 0
batch ``forward_mode``,                decode or extend; 0 (the batch-wide
``forward_iter``, ``enable_overlap``   ``SGLANG_SWA_EVICTION_INTERVAL`` cadence then slides
                                       at every step: ``Rules.swa_eviction_interval`` 1);
                                       False
the rest                               as :class:`~kvpool.sglang.glue_v0516.GlueReqV0516` /
                                       :class:`~kvpool.sglang.glue_v0516.GlueBatchV0516`
=====================================  ===================================================

The oracle is kvpool's SWA lifecycle under ``Rules.for_sglang("0.5.16")``
(``swa_window_release="maybe_evict"``: specs/fidelity.md). With the radix cache on, 0.5.16's
registry builds its own FULL+SWA ``UnifiedRadixCache``, over which
:mod:`kvpool.sglang.glue_v0516_swa_radix` runs the same glue (its
``swa_manager_factory_v0516`` picks the manager of a configuration).

kvpool's streaming sessions (kvpool's emulation, not SGLang's glue) carry a turn's cursor with
its row: a turn's first extend has no SGLang KV record yet (0.5.16 creates it there with
``swa_evicted_seqlen=0``), so its window does not slide there and the carried cursor stays the
manager's.
"""

from __future__ import annotations

import ast
import sys
import types
from collections import Counter
from typing import Any

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.optimized.req import Req
from kvpool.optimized.swa.chunk_cache import SWAChunkCache
from kvpool.optimized.swa.kv_pool import SWAKVPool
from kvpool.reference.lifecycle.swa_memory_manager import check_swa_config
from kvpool.sglang.cache_req import InsertedLen
from kvpool.sglang.glue import link_counted
from kvpool.sglang.glue_manager import GLUE_MODULES, SGLangGlueManager
from kvpool.sglang.glue_swa import SGLangSWAGlueManager, SWAReqState, _Mode
from kvpool.sglang.glue_v0516 import (
    ChunkGlueReqV0516,
    GlueBatchV0516,
    GlueKvV0516,
    KvRecords,
    SGLangGlueManagerV0516,
    install_server_args,
)
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.req_to_token import SGLangReqToTokenPool
from kvpool.sglang.rewrite import extract_definitions, rewrite_imports
from kvpool.sglang.swa import SGLangSWAAllocator

SCHEDULE_BATCH = "sglang/srt/managers/schedule_batch.py"
DSV4_HOOKS = "sglang/srt/hardware_backend/npu/dsv4/dsv4_common_hooks.py"
CURSOR = "swa"
"""The key of the request's single SWA cursor in :attr:`SWAReqState.evicted` (0.5.16 keeps one
``swa_evicted_seqlen``, 0.5.23 one per component)."""
_SWA_GLUE = ("maybe_evict_swa", "_evict_swa")
"""0.5.16's ``ScheduleBatch`` SWA methods that run on :class:`SWAGlueBatchV0516` (counted as
``schedule_batch.NAME``)."""

_PRIVATE: dict[tuple[int, str], types.ModuleType] = {}


def sglang_module(modules: SGLangModules, dotted: str) -> types.ModuleType:
    """SGLang's module ``dotted`` executed from the release's own file: the loader's module when
    it executes that file for real, else the file executed here once per process and release,
    its imports resolved through the loader's private names (stubs where the loader stubs), in
    a module of its own that nothing else imports. ConfigError when the release lacks it."""
    importer = modules.importer
    if dotted in importer.real:
        return modules.module(dotted)
    key = (id(modules), dotted)
    found = _PRIVATE.get(key)
    if found is not None:
        return found
    relpath = dotted.replace(".", "/") + ".py"
    text = modules.source.read(relpath)
    if text is None:
        raise ConfigError(f"SGLang {modules.version} has no {relpath}")
    filename = modules.source.filename(relpath)
    name = f"_kvpool_private_{importer.prefix}.{dotted}"
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # dataclasses and typing look a class's module up by name
    try:
        code = compile(rewrite_imports(ast.parse(text, filename), importer.prefix), filename,
                       "exec")  # fmt: skip
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    _PRIVATE[key] = module
    return module


class _BatchMethodsV0516:
    """0.5.16's ``ScheduleBatch.maybe_evict_swa`` and ``_evict_swa``, compiled from the
    release's ``managers/schedule_batch.py`` in a namespace holding what they read: the
    release's ``envs``, ``get_server_args`` (the manager's :class:`GlueServerArgs`),
    ``maybe_evict_dsv4_state`` (SGLang's, from its DeepSeek-V4 hooks), and
    ``free_swa_out_of_window_slots`` looked up in the loaded ``common`` at each call (so that it
    is counted, and a patched one runs). Each call counts as ``schedule_batch.NAME``."""

    def __init__(self, modules: SGLangModules, server_args: Any) -> None:
        text = modules.source.read(SCHEDULE_BATCH)
        if text is None:
            raise ConfigError(f"SGLang {modules.version} has no {SCHEDULE_BATCH}")
        tree = ast.parse(text)
        body = [n for c in tree.body if isinstance(c, ast.ClassDef)
                and c.name == "ScheduleBatch" for n in c.body]  # fmt: skip
        defs = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in _SWA_GLUE]
        if {d.name for d in defs} != set(_SWA_GLUE):
            raise ConfigError(f"SGLang {modules.version}'s ScheduleBatch has no maybe_evict_swa")
        common = modules.module(GLUE_MODULES["common"])

        def free_swa_out_of_window_slots(*args: Any, **kwargs: Any) -> Any:
            return common.free_swa_out_of_window_slots(*args, **kwargs)

        namespace: dict[str, Any] = {
            "envs": sglang_module(modules, "sglang.srt.environ").envs,
            "get_server_args": lambda: server_args,
            "maybe_evict_dsv4_state": _dsv4_state_hook(modules),
            "free_swa_out_of_window_slots": free_swa_out_of_window_slots,
            "Req": Any,
            "__name__": "sglang.srt.managers.schedule_batch",
        }
        code = compile(ast.Module(body=list(defs), type_ignores=[]),
                       modules.source.filename(SCHEDULE_BATCH), "exec")  # fmt: skip
        exec(code, namespace)
        self.counts: Counter[str] = Counter()
        self._fns = {name: namespace[name] for name in _SWA_GLUE}

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.counts[f"schedule_batch.{name}"] += 1
        return self._fns[name](*args, **kwargs)


def _dsv4_state_hook(modules: SGLangModules) -> Any:
    """SGLang 0.5.16's ``maybe_evict_dsv4_state`` (compiled from its DeepSeek-V4 NPU hooks: the
    function alone; it returns at once for an allocator without ``c4_state_attn_allocator``, as
    the SWA allocator is, before it reaches any helper of its module)."""
    text = modules.source.read(DSV4_HOOKS)
    if text is None:
        raise ConfigError(f"SGLang {modules.version} has no {DSV4_HOOKS}")
    tree = extract_definitions(ast.parse(text), ["maybe_evict_dsv4_state"])
    namespace: dict[str, Any] = {"__name__": "sglang.srt.hardware_backend.npu.dsv4"}
    exec(compile(tree, modules.source.filename(DSV4_HOOKS), "exec"), namespace)
    return namespace["maybe_evict_dsv4_state"]


class SWAGlueKvV0516(GlueKvV0516):
    """0.5.16's ``req.kv`` (``ReqKvInfo``) with the SWA cursor, ``swa_evicted_seqlen``."""

    __slots__ = ()

    @property
    def swa_evicted_seqlen(self) -> int:
        owner: Any = self._owner
        return int(owner.state.evicted.get(CURSOR, 0))

    @swa_evicted_seqlen.setter
    def swa_evicted_seqlen(self, value: int) -> None:
        owner: Any = self._owner
        owner.state.evicted[CURSOR] = int(value)


class SWAGlueReqV0516(ChunkGlueReqV0516):
    """A kvpool request as 0.5.16's SWA glue sees it (module docstring)."""

    __slots__ = ("state",)
    state: SWAReqState

    def __init__(self, req: Any, records: KvRecords, state: SWAReqState, *args: Any) -> None:
        super().__init__(req, records, *args)
        object.__setattr__(self, "state", state)

    @property  # type: ignore[override]
    def kv(self) -> SWAGlueKvV0516 | None:
        return SWAGlueKvV0516(self) if self._records.holds(self.req) else None

    @kv.setter
    def kv(self, value: Any) -> None:
        """SGLang's ``ReqKvInfo`` (a request's first extend: its cursor starts at 0, which the
        manager's state already holds but for a restored session turn, whose carried cursor
        stays) or None (the release)."""
        if value is None:
            self._records.drop(self.req)
            return
        if int(value.swa_evicted_seqlen) != 0:
            raise AttributeError("SGLang created a KV record with a cursor; 0.5.16 starts at 0")
        self.req.kv_allocated_len = int(value.kv_allocated_len)
        self._records.add(self.req)

    @property
    def seqlen(self) -> int:
        """SGLang's ``len(origin_input_ids) + len(output_ids)`` at a decode: the committed
        tokens plus the sampled one whose KV the step computes."""
        return int(self.req.kv_committed_len) + 1

    @property
    def decode_batch_idx(self) -> int:
        return self.state.decode_batch_idx


class SWAGlueBatchV0516(GlueBatchV0516):
    """A :class:`GlueBatchV0516` on which 0.5.16's own ``maybe_evict_swa`` runs (the fields it
    reads: ``forward_mode``, ``forward_iter`` 0, ``enable_overlap`` False, ``prefix_lens``)."""

    __slots__ = ("_sb", "enable_overlap", "forward_iter", "forward_mode")

    def __init__(self, reqs: list[Any], pool: Any, tree: Any, sb: _BatchMethodsV0516) -> None:
        super().__init__(reqs, pool, tree)
        self._sb = sb
        self.enable_overlap = False
        self.forward_iter = 0
        self.forward_mode = _Mode(decode=False)

    def maybe_evict_swa(self) -> None:
        """SGLang's ``ScheduleBatch.maybe_evict_swa`` with this batch as ``self``."""
        self._sb.call("maybe_evict_swa", self)

    def _evict_swa(self, req: Any, pre_len: int) -> None:
        self._sb.call("_evict_swa", self, req, pre_len)

    def for_decode(self, rows: list[int], seq_lens: list[int]) -> GlueBatchV0516:
        self.forward_mode = _Mode(decode=True)
        return super().for_decode(rows, seq_lens)


class SGLangSWAChunkCacheV0516(SWAChunkCache):
    """kvpool's SWA chunk cache (the lifecycle's tree calls and snapshot: no tree, nothing
    cached) whose ``impl`` is SGLang 0.5.16's ``SWAChunkCache`` over the same
    ``ReqToTokenPool`` and SWA allocator: the glue reaches ``impl``."""

    def __init__(self, modules: SGLangModules, pool: SGLangReqToTokenPool,
                 alloc: SGLangSWAAllocator, page_size: int, window: int,
                 chunked_prefill_size: int) -> None:  # fmt: skip
        super().__init__(pool, alloc, page_size, window)  # type: ignore[arg-type]
        chunk = sglang_module(modules, "sglang.srt.mem_cache.chunk_cache")
        params = modules.attr("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")
        self.impl: Any = chunk.SWAChunkCache(params(
            disable=True, req_to_token_pool=pool.impl, token_to_kv_pool_allocator=alloc.impl,
            page_size=page_size, sliding_window_size=window,
            chunked_prefill_size=chunked_prefill_size))  # fmt: skip
        self._inserted = InsertedLen()


class SGLangSWAGlueManagerV0516(SGLangGlueManagerV0516, SGLangSWAGlueManager):
    """The SWA lifecycle over SGLang 0.5.16's components with 0.5.16's glue, the radix cache
    disabled (module docstring). From :class:`SGLangGlueManagerV0516`: the stand-ins' record,
    the match (kvpool's), the release and the chunk call; from :class:`SGLangSWAGlueManager`:
    the interval, the decode count, the EAGLE v2 step's order, the sessions' cursor carry and
    the snapshot."""

    radix_cache = False
    """Whether this manager's tree is 0.5.16's radix-cache tree (its FULL+SWA
    ``UnifiedRadixCache``: :class:`SGLangSWARadixGlueManagerV0516`), not its
    ``SWAChunkCache``."""

    def __init__(
        self, config: PoolConfig, modules: SGLangModules, naive_extend: bool = False
    ) -> None:
        window = check_swa_config(config)
        if config.disable_radix_cache == self.radix_cache:
            # 0.5.16's registry builds SWAChunkCache with it off, UnifiedRadixCache with it on
            tree_name = "UnifiedRadixCache" if self.radix_cache else "SWAChunkCache"
            raise ConfigError(f"{type(self).__name__} runs over SGLang 0.5.16's {tree_name}: "
                              f"disable_radix_cache must be {not self.radix_cache}")  # fmt: skip
        if config.rules.swa_window_release != "maybe_evict":
            raise ConfigError("SGLang 0.5.16's window timing is Rules.swa_window_release "
                              "'maybe_evict' (Rules.for_sglang('0.5.16'))")  # fmt: skip
        ps = config.page_size
        alloc = SGLangSWAAllocator(modules, config.size, config.swa_size, ps, config.need_sort,
                                   naive_extend=naive_extend)  # fmt: skip
        pool = SGLangReqToTokenPool(modules, config.req_pool_size, config.max_context_len)
        tree = self._build_tree(modules, pool, alloc, config, window)
        layers = range(config.num_layers)
        self._kv = SWAKVPool(config.size, config.swa_size, ps, "float32", config.head_num,
                             config.head_dim, [i for i in layers if i % 2],
                             [i for i in layers if not i % 2], config.v_head_dim)  # fmt: skip
        self._kv.register_mapping(alloc.full_to_swa_index_mapping)
        self.sliding_window = window
        self._states: dict[str, SWAReqState] = {}
        self._session_swa: dict[str, SWAReqState] = {}
        glue_modules = [modules.module(dotted) for dotted in GLUE_MODULES.values()]
        self._server_args = install_server_args(glue_modules)
        # neither parent's constructor fits (0.5.23's tree, the full-attention tree): the glue
        # manager's directly
        SGLangGlueManager.__init__(self, config, modules, token_to_kv_pool_allocator=alloc,
                                   req_to_token_pool=pool, tree_cache=tree)  # fmt: skip
        self._records = KvRecords()
        self.kv_cache = self._kv  # type: ignore[assignment]  # the SWA layers' KV tags
        self._sb16 = schedule_batch_methods_v0516(modules, self._server_args)
        self.glue_calls.append(self._sb16.counts)
        link_counted(glue_modules)

    def _build_tree(self, modules: SGLangModules, pool: SGLangReqToTokenPool,
                    alloc: SGLangSWAAllocator, config: PoolConfig, window: int) -> Any:  # fmt: skip
        """The tree 0.5.16's registry builds with the radix cache off: its ``SWAChunkCache``
        (:class:`SGLangSWAChunkCacheV0516`)."""
        # the server's chunked prefill size: read by maybe_evict_swa's overlap branch only (the
        # overlap scheduler is off); kvpool draws each chunk's size itself
        return SGLangSWAChunkCacheV0516(modules, pool, alloc, config.page_size, window,
                                        config.max_context_len)  # fmt: skip

    # ----------------------------------------------------------------- stand-ins
    def _glue(self, req: Req) -> SWAGlueReqV0516:  # type: ignore[override]
        self._bind()
        tree: Any = self.tree_cache
        return SWAGlueReqV0516(req, self._records, self._state(req), tree._inserted)

    def _glue_batch(self, reqs: Any) -> SWAGlueBatchV0516:  # type: ignore[override]
        pool: Any = self.req_to_token_pool
        tree: Any = self.tree_cache
        return SWAGlueBatchV0516([self._glue(r) for r in reqs], pool.impl, tree.impl,
                                 self._sb16)  # fmt: skip

    def swa_evicted_seqlen(self, rid: str) -> int:
        """SGLang's ``req.kv.swa_evicted_seqlen`` of ``rid`` (0 without a row)."""
        req = self.reqs.get(rid)
        if req is None or req.req_pool_idx is None:
            return 0
        state = self._states.get(rid)
        return state.evicted.get(CURSOR, 0) if state is not None else 0

    # ----------------------------------------------------------------- steps
    def _prepare_spec_step(self, reqs: list[Req], starts: list[int], ends: list[int]) -> None:
        """``eagle_prepare_for_decode`` before its allocation: kvpool's capacity check for the
        grown columns ``[starts[i], ends[i])`` (a refused step changes nothing), then 0.5.16's
        ``maybe_evict_swa`` on the decode batch, then each request's ``decode_batch_idx``
        advances."""
        if starts:
            self._check_capacity(self._tokens_needed(starts, ends))
        if not reqs:
            return
        batch = self._glue_batch(reqs)
        batch.forward_mode = _Mode(decode=True)
        with self._interval():
            batch.maybe_evict_swa()
        for req in reqs:
            self._state(req).decode_batch_idx += 1

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """0.5.16's ``release_kv_cache`` (:class:`SGLangGlueManagerV0516`'s), then the
        request's SWA state is forgotten."""
        super().release_kv_cache(req, is_insert)
        self._states.pop(req.rid, None)

    def close_session(self, session_id: str) -> None:
        """kvpool's close (0.5.16 has no row-segment free: the SWA allocator's ``free`` skips
        the slots whose SWA slot slid away), then the session's carried cursor is dropped."""
        MemoryManager.close_session(self, session_id)
        self._session_swa.pop(session_id, None)


_METHODS: dict[int, _BatchMethodsV0516] = {}


def schedule_batch_methods_v0516(modules: SGLangModules, server_args: Any) -> _BatchMethodsV0516:
    """The compiled methods of ``modules``' release (once per process and release: the server
    arguments object is one per process too, :func:`install_server_args`)."""
    found = _METHODS.get(id(modules))
    if found is None:
        found = _METHODS[id(modules)] = _BatchMethodsV0516(modules, server_args)
    return found


def glue_covers_v0516_swa(config: PoolConfig) -> bool:
    """Whether 0.5.16's SWA glue drives this sliding-window configuration: no host tier, no
    hybrid Mamba model, no layer-wise loading; the radix cache off (its ``SWAChunkCache``:
    :class:`SGLangSWAGlueManagerV0516`) or on (its FULL+SWA ``UnifiedRadixCache``, under
    ``Rules.swa_tree == "unified"``, the pairing kvpool's reference models:
    :class:`SGLangSWARadixGlueManagerV0516`)."""
    return (
        (config.disable_radix_cache or config.rules.swa_tree == "unified")
        and not config.enable_hierarchical_cache
        and config.mamba_slots is None
        and not config.layerwise_loading
    )


def reachability_v0516_swa(config: PoolConfig, ops: Any) -> str:
    """The reachability line of a sliding-window lifecycle trace against SGLang 0.5.16
    (:func:`~kvpool.sglang.glue_manager.reachability`, covered where
    :func:`glue_covers_v0516_swa` says so)."""
    from kvpool.sglang.glue_manager import reachability

    return reachability(config, ops, covered=glue_covers_v0516_swa(config))


__all__ = [
    "SGLangSWAChunkCacheV0516",
    "SGLangSWAGlueManagerV0516",
    "SWAGlueBatchV0516",
    "SWAGlueKvV0516",
    "SWAGlueReqV0516",
    "glue_covers_v0516_swa",
    "reachability_v0516_swa",
    "schedule_batch_methods_v0516",
    "sglang_module",
]

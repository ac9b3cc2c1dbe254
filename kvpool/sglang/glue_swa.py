"""``SGLangSWAGlueManager``: the lifecycle of a hybrid sliding-window model whose memory steps
are SGLang 0.5.23's own glue, over SGLang's SWA allocator and the tree its registry builds.

:class:`~kvpool.sglang.glue_manager.SGLangGlueManager` (the full-attention glue lifecycle) over
SGLang's ``SWATokenToKVPoolAllocator`` (:class:`~kvpool.sglang.swa.SGLangSWAAllocator`), its
``ReqToTokenPool`` and its ``UnifiedRadixCache`` with the FULL and SWA components (disabled for
``--disable-radix-cache``: what 0.5.23's ``registry.default_radix_cache_factory`` builds for a
hybrid, not pure, SWA model either way), and the twin's ``SWAKVPool`` (the KV tags) over the
allocator's mapping. The glue's SWA paths run as SGLang wrote them:

- ``alloc_for_extend`` / ``alloc_for_decode`` call ``batch.maybe_evict_swa()``: SGLang's own
  ``ScheduleBatch.maybe_evict_swa`` (and ``_swa_eviction_trigger``, ``_evict_swa``) run with
  the :class:`SWAGlueBatch` as ``self``; they call the tree's ``evict_sliding_windows``, i.e.
  ``common.free_swa_out_of_window_slots``. ``SGLANG_SWA_EVICTION_INTERVAL`` is
  ``Rules.swa_eviction_interval`` during the call.
- An EAGLE v2 step runs ``maybe_evict_swa`` on the decode batch, then advances the decode
  counts, then calls ``alloc_for_spec_decode``, in ``eagle_prepare_for_decode``'s order.
- ``release_kv_cache`` and ``checkpoint_kv_cache`` read and move the request's SWA cursor
  (``req.kv.get_evicted_seqlen`` / ``set_evicted_seqlen``, ``swa_dead_lo``); the tree's
  ``free_kv_row`` is ``common.free_kv_row_segments`` (window-dead columns full-side only).
- ``match_kv_cache`` records ``swa_branching_seqlen``, which the next checkpoint reads.

Scheduler state SGLang keeps on its ``Req`` and kvpool's request does not, the manager keeps per
request (:class:`SWAReqState`): the SWA cursor (``component_evicted_seqlens``), the decode
steps since admission (``decode_batch_idx``, advanced after each decode allocation, as
``prepare_for_decode`` does, and after an EAGLE v2 step's slide, as
``eagle_prepare_for_decode`` does) and the branching point; SGLang's ``mark_kv_released``
forgets them. kvpool's streaming sessions (kvpool's emulation) carry a turn's cursor with its
row, as :class:`~kvpool.optimized.lifecycle.swa_memory_manager.SWAMemoryManager` does.

The oracle is kvpool's SWA lifecycle under ``Rules.for_sglang("0.5.23")``
(``swa_window_release="scheduler"``: specs/fidelity.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError, OutOfMemoryError
from kvpool.optimized.lifecycle.spec_decode import spec_step
from kvpool.optimized.req import Req
from kvpool.optimized.swa.kv_pool import SWAKVPool
from kvpool.reference.lifecycle.stops import check_swa_stops
from kvpool.reference.lifecycle.swa_memory_manager import check_swa_config
from kvpool.reference.swa.lifecycle import swa_eviction_demand
from kvpool.sglang.glue import GlueBatch, GlueKv, GlueReq, link_counted
from kvpool.sglang.glue_manager import SGLangGlueManager
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.req_to_token import SGLangReqToTokenPool
from kvpool.sglang.swa import SGLangSWAAllocator
from kvpool.sglang.unified_radix import SGLangUnifiedRadixCache
from kvpool.sglang.unified_swa_radix import SGLangUnifiedSWARadixCache
from kvpool.snapshot import PoolSnapshot, SWAAllocatorSnapshot, TreeSnapshot

SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
_INTERVAL_ENV = "SGLANG_SWA_EVICTION_INTERVAL"
_SWA_GLUE = ("maybe_evict_swa", "_swa_eviction_trigger", "_evict_swa")
"""``ScheduleBatch`` methods of SGLang's that run on :class:`SWAGlueBatch` (counted as
``schedule_batch.NAME``)."""


@dataclasses.dataclass
class SWAReqState:
    """SGLang's SWA scheduler fields of one request hand-out (tokens)."""

    evicted: dict[Any, int] = dataclasses.field(default_factory=dict)
    """``kv.component_evicted_seqlens``."""
    decode_batch_idx: int = 0
    branching: int | None = None
    """``swa_branching_seqlen`` of the last match."""


class SWAGlueKv(GlueKv):
    """``req.kv`` with SGLang's SWA cursor (:class:`SWAReqState`)."""

    __slots__ = ()

    def get_evicted_seqlen(self, component_type: Any) -> int:
        owner: Any = self._owner
        return int(owner.state.evicted.get(component_type, 0))

    def set_evicted_seqlen(self, component_type: Any, length: int) -> None:
        owner: Any = self._owner
        owner.state.evicted[component_type] = int(length)

    def swa_dead_lo(self, page_size: int) -> int:
        """SGLang's formula: ``max(cache_protected_len, swa_evict_floor)`` (the floor is 0:
        no prefill-aware shield), page-aligned upward when the floor wins."""
        return max(self.cache_protected_len, self.swa_evict_floor)

    def mark_kv_released(self) -> None:
        """SGLang clears the request's cursors (and the release is noted, as for any glue
        request)."""
        owner: Any = self._owner
        owner.state.evicted.clear()
        super().mark_kv_released()


class SWAGlueReq(GlueReq):
    """A :class:`GlueReq` with the SWA fields (module docstring)."""

    __slots__ = ("state",)
    state: SWAReqState

    def __init__(self, req: Any, state: SWAReqState, *args: Any) -> None:
        super().__init__(req, *args)
        object.__setattr__(self, "state", state)

    @property
    def kv(self) -> SWAGlueKv:
        return SWAGlueKv(self)

    @property
    def seqlen(self) -> int:
        """The scheduler's ``len(origin_input_ids) + len(output_ids)`` at a decode: the
        committed tokens plus the sampled one whose KV the step computes."""
        return int(self.req.kv_committed_len) + 1

    @property
    def decode_batch_idx(self) -> int:
        return self.state.decode_batch_idx

    @property  # type: ignore[override]
    def swa_branching_seqlen(self) -> int | None:
        return self.state.branching

    @swa_branching_seqlen.setter
    def swa_branching_seqlen(self, value: int | None) -> None:
        self.state.branching = None if value is None else int(value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "swa_branching_seqlen":
            self.state.branching = None if value is None else int(value)
            return
        super().__setattr__(name, value)


class _Mode:
    """``forward_mode``: decode or extend."""

    __slots__ = ("decode",)

    def __init__(self, decode: bool) -> None:
        self.decode = decode

    def is_decode(self) -> bool:
        return self.decode

    def is_extend(self) -> bool:
        return not self.decode


class SWAGlueBatch(GlueBatch):
    """A :class:`GlueBatch` on which SGLang's own ``maybe_evict_swa`` runs: the fields it
    reads (``forward_mode``, ``token_to_kv_pool_allocator``, ``enable_overlap`` False,
    ``forward_iter``), its helpers SGLang's, bound to this object."""

    __slots__ = ("_sb", "enable_overlap", "forward_iter", "forward_mode",
                 "token_to_kv_pool_allocator")  # fmt: skip

    def __init__(self, reqs: list[GlueReq], pool: Any, tree: Any, alloc: Any, sb: Any) -> None:
        super().__init__(reqs, pool, tree)
        self.token_to_kv_pool_allocator = alloc
        self.enable_overlap = False
        self.forward_iter = 0
        self._sb = sb
        self.forward_mode = _Mode(decode=False)

    def maybe_evict_swa(self) -> None:
        """SGLang's ``ScheduleBatch.maybe_evict_swa`` with this batch as ``self``."""
        self._sb.maybe_evict_swa(self)

    def _swa_eviction_trigger(self, window: int, interval: int) -> Any:
        return self._sb._swa_eviction_trigger(self, window, interval)

    def _evict_swa(self, req: Any, pre_len: int, *, eviction_interval: int = 1) -> None:
        self._sb._evict_swa(self, req, pre_len, eviction_interval=eviction_interval)

    def for_decode(self, rows: list[int], seq_lens: list[int]) -> GlueBatch:
        self.forward_mode = _Mode(decode=True)
        return super().for_decode(rows, seq_lens)


class SGLangSWAGlueTree(SGLangUnifiedRadixCache):
    """SGLang's ``UnifiedRadixCache`` with the FULL and SWA components (disabled or not) over
    the ``ReqToTokenPool`` and SWA allocator, with the FULL adapter's calls and the SWA sizes
    and snapshot of :class:`~kvpool.sglang.unified_swa_radix.SGLangUnifiedSWARadixCache`."""

    def __init__(self, modules: Any, pool: Any, alloc: Any, page_size: int, window: int,
                 disable: bool, eviction_policy: str, tree_core: str,
                 is_eagle: bool = False) -> None:  # fmt: skip
        self.page_size = page_size
        self.disable = disable
        self.eviction_policy = eviction_policy.lower()
        self.sliding_window_size = window
        from kvpool.sglang.cache_req import InsertedLen

        self._inserted = InsertedLen()
        self._build(modules, tree_core, ("full", "swa"), disable=disable,
                    req_to_token_pool=getattr(pool, "impl", pool),
                    token_to_kv_pool_allocator=getattr(alloc, "impl", alloc),
                    page_size=page_size, eviction_policy=eviction_policy,
                    sliding_window_size=window, is_eagle=is_eagle)  # fmt: skip
        self.is_eagle = bool(self.impl.tree_core.is_eagle)
        self._swa = self._unified.component_type.SWA
        self._tree_lock = self._lock_of

    def evictable_size(self) -> int:
        return int(self.impl.full_evictable_size())

    def protected_size(self) -> int:
        return int(self.impl.full_protected_size())

    def swa_evictable_size(self) -> int:
        return int(self.impl.swa_evictable_size())

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]:  # type: ignore[override]
        """(full tokens freed, SWA tokens freed)."""
        params = self.modules.attr("sglang.srt.mem_cache.base_prefix_cache", "EvictParams")(
            num_tokens=num_tokens, swa_num_tokens=swa_num_tokens
        )
        with self._call():
            result = self.impl.evict(params)
        return int(result.num_tokens_evicted), int(result.swa_num_tokens_evicted)

    @property
    def swa_lock_counts_readable(self) -> bool:
        """Whether the snapshot reports per-node SWA lock counts and the SWA sizes' split (the
        Python core only: SGLang's Rust core exposes no per-node SWA lock count)."""
        return self.tree_core == "python"

    def snapshot(self) -> TreeSnapshot:
        """The unified SWA adapter's snapshot, with two reporting rules that keep the pool
        invariants' SWA lock clauses meaningful: a tombstone's SWA lock count reads 0 (0.5.23
        counts window locks on tombstones, which move no SWA size; the reference's
        ``UnifiedSWARadixLifecycle.snapshot`` reports the same); on the Rust core, whose nodes'
        SWA lock counts are unknown (all 0 but the root's), the SWA sizes are reported as one
        evictable total (the lockstep machine then compares both sides' totals:
        :func:`kvpool.testing.machines.swa_manager.coarse_swa_pool`)."""
        if self.disable:
            return super().snapshot()
        readable = self.swa_lock_counts_readable
        rows = (
            SGLangUnifiedSWARadixCache._python_swa_rows(self)  # type: ignore[arg-type]
            if readable
            else SGLangUnifiedSWARadixCache._rust_swa_rows(self)  # type: ignore[arg-type]
        )
        rows = [dataclasses.replace(n, swa_lock_ref=0) if n.swa_tombstone else n for n in rows]
        impl = self.impl
        swa_evictable, swa_protected = int(impl.swa_evictable_size()), int(
            impl.swa_protected_size())  # fmt: skip
        if not readable:
            swa_evictable, swa_protected = swa_evictable + swa_protected, 0
        return TreeSnapshot(
            page_size=self.page_size, disabled=False, eviction_policy="",
            evictable_size=int(impl.full_evictable_size()),
            protected_size=int(impl.full_protected_size()), nodes=tuple(rows),
            swa_evictable_size=swa_evictable, swa_protected_size=swa_protected,
        )  # fmt: skip


class SGLangSWAGlueManager(SGLangGlueManager):
    """The SWA lifecycle over SGLang's components with SGLang's glue (module docstring)."""

    def __init__(
        self,
        config: PoolConfig,
        modules: SGLangModules,
        tree_core: str = "rust",
        naive_extend: bool = False,
    ) -> None:
        window = check_swa_config(config)
        ps = config.page_size
        alloc = SGLangSWAAllocator(modules, config.size, config.swa_size, ps, config.need_sort,
                                   naive_extend=naive_extend)  # fmt: skip
        pool = SGLangReqToTokenPool(modules, config.req_pool_size, config.max_context_len)
        tree = SGLangSWAGlueTree(modules, pool, alloc, ps, window, config.disable_radix_cache,
                                 config.eviction_policy, tree_core, config.is_eagle)  # fmt: skip
        layers = range(config.num_layers)
        self._kv = SWAKVPool(config.size, config.swa_size, ps, "float32", config.head_num,
                             config.head_dim, [i for i in layers if i % 2],
                             [i for i in layers if not i % 2], config.v_head_dim)  # fmt: skip
        self._kv.register_mapping(alloc.full_to_swa_index_mapping)
        self.sliding_window = window
        self._states: dict[str, SWAReqState] = {}
        self._session_swa: dict[str, SWAReqState] = {}
        super().__init__(config, modules, token_to_kv_pool_allocator=alloc,
                         req_to_token_pool=pool, tree_cache=tree)  # fmt: skip
        self.kv_cache = self._kv  # type: ignore[assignment]  # the SWA layers' KV tags, over SGLang's mapping
        self._sb = schedule_batch_methods(modules)
        self.glue_calls.append(self._sb.counts)
        link_counted([modules.module(d) for d in ("sglang.srt.mem_cache.allocation",
                                                  "sglang.srt.mem_cache.common")])  # fmt: skip

    # ----------------------------------------------------------------- stand-ins
    def _state(self, req: Req) -> SWAReqState:
        return self._states.setdefault(req.rid, SWAReqState())

    def _glue(self, req: Req) -> GlueReq:
        tree: Any = self.tree_cache
        return SWAGlueReq(req, self._state(req), tree._inserted, tree._tree_lock,
                          getattr(tree, "node_ref", None))  # fmt: skip

    def _glue_batch(self, reqs: Sequence[Req]) -> GlueBatch:
        pool: Any = self.req_to_token_pool
        tree: Any = self.tree_cache
        alloc: Any = self.token_to_kv_pool_allocator
        return SWAGlueBatch([self._glue(r) for r in reqs], pool.impl, tree.impl, alloc.impl,
                            self._sb)  # fmt: skip

    @contextlib.contextmanager
    def _interval(self) -> Iterator[None]:
        """``SGLANG_SWA_EVICTION_INTERVAL`` = ``Rules.swa_eviction_interval`` for one call."""
        old = os.environ.get(_INTERVAL_ENV)
        os.environ[_INTERVAL_ENV] = str(self.config.rules.swa_eviction_interval)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(_INTERVAL_ENV, None)
            else:
                os.environ[_INTERVAL_ENV] = old

    def swa_evicted_seqlen(self, rid: str) -> int:
        """SGLang's SWA cursor of ``rid`` (0 without a row)."""
        req = self.reqs.get(rid)
        if req is None or req.req_pool_idx is None:
            return 0
        state = self._states.get(rid)
        return max(state.evicted.values(), default=0) if state is not None else 0

    # ----------------------------------------------------------------- primitives
    def _check_capacity(self, needed: int) -> None:
        """With the radix cache: each pool's free plus evictable tokens must reach
        ``needed`` (the twin's SWA rule); the chunk cache: the manager's."""
        tree: Any = self.tree_cache
        if tree.disable:
            super()._check_capacity(needed)
            return
        alloc: Any = self.token_to_kv_pool_allocator
        full = alloc.full_available_size() + tree.evictable_size()
        swa = alloc.swa_available_size() + tree.swa_evictable_size()
        if min(full, swa) < needed:
            raise OutOfMemoryError(f"need {needed} tokens; full {full}, SWA {swa} with eviction")

    def _evict_for(self, needed: int, new_tokens: int = 0, batch_size: int = 0) -> None:
        tree: Any = self.tree_cache
        if tree.disable:
            super()._evict_for(needed, new_tokens, batch_size)
            return
        self._check_capacity(needed)
        alloc: Any = self.token_to_kv_pool_allocator
        demand = swa_eviction_demand(self.config.rules, needed, new_tokens, batch_size,
                                     self.page_size)  # fmt: skip
        full = max(0, demand - alloc.full_available_size())
        swa = max(0, demand - alloc.swa_available_size())
        if full or swa:
            tree.evict(full, swa)

    def evict(self, num_tokens: int) -> int:
        tree: Any = self.tree_cache
        if tree.disable:
            return super().evict(num_tokens)
        from kvpool.errors import InvalidArgumentError

        if num_tokens < 0:
            raise InvalidArgumentError(f"num_tokens must be >= 0, got {num_tokens}")
        return int(tree.evict(num_tokens)[0])

    def alloc_for_extend(self, reqs: Sequence[Req], seq_lens: Sequence[int]) -> torch.Tensor:
        with self._interval():
            return super().alloc_for_extend(reqs, seq_lens)

    def alloc_for_decode(self, reqs: Sequence[Req]) -> torch.Tensor:
        """SGLang's ``alloc_for_decode`` (its ``maybe_evict_swa`` first); then each request's
        ``decode_batch_idx`` advances, as ``prepare_for_decode`` does."""
        with self._interval():
            out = super().alloc_for_decode(reqs)
        for req in reqs:
            self._state(req).decode_batch_idx += 1
        return out

    def spec_step(
        self, rids: Sequence[str], accepted: Sequence[Sequence[int]], reserve: int
    ) -> torch.Tensor:
        """The glue manager's EAGLE v2 step (SGLang's ``alloc_for_spec_decode`` allocates the
        reserve), prepared as SGLang's ``eagle_prepare_for_decode`` prepares it: after kvpool's
        checks, :meth:`_prepare_spec_step` (the window slide, the decode count)."""
        self._spec_glue = True  # the glue manager's _alloc_slots: alloc_for_spec_decode
        try:
            return spec_step(self, rids, accepted, reserve, prepare=self._prepare_spec_step)
        finally:
            self._spec_glue = False

    def _prepare_spec_step(self, reqs: list[Req], starts: list[int], ends: list[int]) -> None:
        """``eagle_prepare_for_decode`` before its allocation: kvpool's capacity check for the
        grown columns ``[starts[i], ends[i])`` (a refused step changes nothing), then SGLang's
        own ``maybe_evict_swa`` on the decode batch, then each request's ``decode_batch_idx``
        advances (SGLang's order)."""
        if starts:
            self._check_capacity(self._tokens_needed(starts, ends))
        if not reqs:
            return
        batch = self._glue_batch(reqs)
        assert isinstance(batch, SWAGlueBatch)
        batch.forward_mode = _Mode(decode=True)
        with self._interval():
            batch.maybe_evict_swa()
        for req in reqs:
            self._state(req).decode_batch_idx += 1

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        super().release_kv_cache(req, is_insert)
        self._states.pop(req.rid, None)

    # ----------------------------------------------------------------- sessions
    def extend(
        self, rids: Sequence[str], chunk_sizes: Sequence[int | None] | None = None
    ) -> torch.Tensor:
        """A restored session turn carries on the session's SWA state."""
        carried: dict[str, tuple[str, SWAReqState]] = {}
        for rid in rids:
            req = self.reqs.get(rid)
            if req is not None and self._restoring_session(req) is not None:
                assert req.session_id is not None
                carried[rid] = (req.session_id, self._session_swa.get(req.session_id,
                                                                      SWAReqState()))  # fmt: skip
        # the turn's window state must be in place before SGLang's allocation reads it; a
        # refused extend changes nothing, so the session keeps it until the extend succeeds
        for rid, (_sid, state) in carried.items():
            self._states[rid] = state
        try:
            out = super().extend(rids, chunk_sizes)
        except BaseException:
            for rid in carried:
                self._states.pop(rid, None)
            raise
        for sid, _state in carried.values():
            self._session_swa.pop(sid, None)
        return out

    def finish(
        self,
        rids: Sequence[str],
        is_insert: bool = True,
        finished_lens: Sequence[int | None] | None = None,
    ) -> None:
        handed: dict[str, SWAReqState] = {}
        for rid in rids:
            req = self.reqs.get(rid)
            if req is not None and req.session_id is not None and self._session_of(req):
                # the next turn is a new request: its cursor goes on, its decode count and
                # branching point start afresh
                state = self._states.get(rid, SWAReqState())
                handed[req.session_id] = SWAReqState(evicted=dict(state.evicted))
        super().finish(rids, is_insert, finished_lens)  # a refused finish changes nothing
        for rid in rids:
            self._states.pop(rid, None)
        self._session_swa.update(handed)

    def _check_stops(self, reqs: Sequence[Req], stops: Sequence[int | None]) -> None:
        """kvpool's SWA managers' rule (:func:`check_swa_stops`): no stop a whole window or
        more before the last committed token, or at or below the window's cursor."""
        check_swa_stops(reqs, stops, self.sliding_window, self.swa_evicted_seqlen)

    def close_session(self, session_id: str) -> None:
        """kvpool's close; a session whose window slid past its protected prefix frees its
        held columns with SGLang's ``free_kv_row_segments`` (window-dead columns full-side
        only: SGLang's allocator frees the sentinel for an unmapped slot), then its row."""
        session = self.sessions.get(session_id)
        state = self._session_swa.get(session_id)
        evicted = max(state.evicted.values(), default=0) if state is not None else 0
        if (session is not None and session.busy_with is None and session.holds_kv()
                and evicted > session.cache_protected_len):  # fmt: skip
            row = session.req_pool_idx
            assert row is not None
            protected = session.cache_protected_len
            tree: Any = self.tree_cache
            alloc: Any = self.token_to_kv_pool_allocator
            tree.dec_lock_ref(session.last_node)
            held = self.req_to_token_pool.read(row, protected, session.kv_allocated_len)
            self._common.free_kv_row_segments(
                alloc.impl, [(held.to(torch.int64), protected)], swa_evicted_seqlen=evicted,
                swa_dead_lo=protected)  # fmt: skip
            self.req_to_token_pool.free(session)
            session.forget()
            del self.sessions[session_id]
        else:
            super().close_session(session_id)
        self._session_swa.pop(session_id, None)

    def snapshot(self) -> PoolSnapshot:
        """As the twin's SWA manager: ``allocator`` the full pool's, ``swa`` both pools',
        each request's ``swa_evicted_seqlen``."""
        snap = super().snapshot()
        swa = snap.allocator
        assert isinstance(swa, SWAAllocatorSnapshot)
        reqs = tuple(dataclasses.replace(r, swa_evicted_seqlen=self.swa_evicted_seqlen(r.rid))
                     for r in snap.reqs)  # fmt: skip
        sessions = tuple(dataclasses.replace(
            s, swa_evicted_seqlen=(max(self._session_swa[s.session_id].evicted.values(),
                                       default=0)
                                   if s.row and s.session_id in self._session_swa else 0))
            for s in snap.sessions)  # fmt: skip
        full = swa.full
        return dataclasses.replace(snap, allocator=full, swa=swa, reqs=reqs, sessions=sessions,
                                   max_total_num_tokens=full.size)  # fmt: skip


class _SWABatchMethods:
    """SGLang's own ``ScheduleBatch`` SWA methods (:data:`_SWA_GLUE`), compiled from the
    release's ``managers/schedule_batch.py`` (kvpool's loader stubs that module: the rest of
    it imports SGLang's whole runtime) in a namespace holding the names they read (SGLang's
    ``envs``, ``ComponentType``, ``_is_hip`` False); each call is counted as
    ``schedule_batch.NAME``."""

    def __init__(self, modules: SGLangModules) -> None:
        import ast

        text = modules.source.read("sglang/srt/managers/schedule_batch.py")
        if text is None:
            raise ConfigError("this SGLang release has no managers/schedule_batch.py")
        tree = ast.parse(text)
        cls = next(n for n in tree.body
                   if isinstance(n, ast.ClassDef) and n.name == "ScheduleBatch")  # fmt: skip
        defs = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in _SWA_GLUE]
        if {d.name for d in defs} != set(_SWA_GLUE):
            raise ConfigError("this SGLang release's ScheduleBatch has no maybe_evict_swa")
        component = modules.module("sglang.srt.mem_cache.unified_cache.component_type")
        namespace: dict[str, Any] = {
            "envs": modules.module("sglang.srt.environ").envs,
            "ComponentType": component.ComponentType,
            "_is_hip": False,
            "Req": Any,
            "__name__": SCHEDULE_BATCH,
        }
        module = ast.Module(body=list(defs), type_ignores=[])
        code = compile(module, modules.source.filename("sglang/srt/managers/schedule_batch.py"),
                       "exec")  # fmt: skip
        exec(code, namespace)
        self.counts: Counter[str] = Counter()
        self._fns = {name: namespace[name] for name in _SWA_GLUE}

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.counts[f"schedule_batch.{name}"] += 1
        return self._fns[name](*args, **kwargs)

    def maybe_evict_swa(self, batch: Any) -> None:
        self._call("maybe_evict_swa", batch)

    def _swa_eviction_trigger(self, batch: Any, window: int, interval: int) -> Any:
        return self._call("_swa_eviction_trigger", batch, window, interval)

    def _evict_swa(self, batch: Any, req: Any, pre_len: int, *, eviction_interval: int) -> None:
        self._call("_evict_swa", batch, req, pre_len, eviction_interval=eviction_interval)


_METHODS: dict[int, _SWABatchMethods] = {}


def schedule_batch_methods(modules: SGLangModules) -> _SWABatchMethods:
    """The compiled methods of ``modules``' release (once per process and release)."""
    found = _METHODS.get(id(modules))
    if found is None:
        found = _METHODS[id(modules)] = _SWABatchMethods(modules)
    return found


def swa_manager_factory(modules: SGLangModules, tree_core: str, naive_extend: bool = False) -> Any:
    """``swa_manager(config)`` of the implementation (:mod:`kvpool.sglang.implementation`);
    ``naive_extend``: its SWA allocator on SGLang's torch path (``+naive``)."""

    def build(config: PoolConfig) -> SGLangSWAGlueManager:
        return SGLangSWAGlueManager(config, modules, tree_core, naive_extend)

    return build


__all__ = [
    "SGLangSWAGlueManager",
    "SGLangSWAGlueTree",
    "SWAGlueBatch",
    "SWAGlueKv",
    "SWAGlueReq",
    "SWAReqState",
    "schedule_batch_methods",
    "swa_manager_factory",
]

"""``SWAMemoryManager`` (optimized twin): the request lifecycle of a hybrid sliding-window model.

Twin of :mod:`kvpool.reference.lifecycle.swa_memory_manager`, written out again (the lockstep
harness compares the two). A :class:`~kvpool.optimized.lifecycle.memory_manager.MemoryManager` whose
pools are the SWA ones (:mod:`kvpool.injection` puts them in): an
:class:`~kvpool.optimized.swa.allocator.SWATokenToKVPoolAllocator` of ``config.size`` full and
``config.swa_size`` SWA tokens, an :class:`~kvpool.optimized.swa.chunk_cache.SWAChunkCache` and an
:class:`~kvpool.optimized.swa.kv_pool.SWAKVPool` (even layers full attention, odd layers
sliding-window), all sharing the allocator's mapping. Every allocation takes both pools; every
release (finish, abort, retract, the over-allocation of a chunked prefill) frees, through the
allocator's ``free``, exactly the SWA slots still mapped.

After each ``decode`` the window of every decoded request moves:
:func:`~kvpool.optimized.swa.lifecycle.free_swa_out_of_window_slots` releases the SWA slots of
its whole pages that left it (chunk-cache rule: keep ``sliding_window`` tokens), and the manager
remembers, per request row hand-out, its ``swa_evicted_seqlen`` (reported in the snapshot).

With the radix cache on (``disable_radix_cache=False``) the tree is an
:class:`~kvpool.optimized.lifecycle.swa_radix_lifecycle.SWARadixLifecycle` (an ``SWARadixCache``
with SGLang 0.5.16's SWA hand-overs): a finish inserts the committed tokens with the request's
``swa_evicted_seqlen`` (the released part becomes a tombstone node), the window keeps
``max(sliding_window, page_size)`` tokens, and capacity and eviction count each pool apart: a step
needs ``needed`` tokens of free plus evictable in the full pool *and* in the SWA pool, and evicts
each pool's deficit (:func:`~kvpool.optimized.swa.lifecycle.evict_for_swa_alloc`). Under
``Rules.swa_tree == "unified"`` (SGLang 0.5.16's registry: its FULL+SWA ``UnifiedRadixCache``)
the tree is a :class:`~kvpool.optimized.lifecycle.swa_radix_lifecycle.UnifiedSWARadixLifecycleV0516`
(that tree with 0.5.16's unified hand-overs) and full eviction follows ``eviction_policy``.

Streaming sessions: a finished turn hands its row *and its window* (``swa_evicted_seqlen``) to
the session, the next turn's first extend carries them on, and a close frees the session's
slots through the allocator's ``free`` (each pool gets back exactly what it holds).

Scope (kvpool): at least 2 layers, an MHA layout, a window, plain KV storage and no host tier
(ConfigError otherwise: :func:`check_swa_config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from kvpool.config import PoolConfig
from kvpool.constants import ceil_align
from kvpool.errors import InvalidArgumentError, KVPoolError, OutOfMemoryError
from kvpool.host_checks import as_bool, as_count, as_instance, as_str, str_list
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.optimized.lifecycle.pool_snapshot import build_pool_snapshot
from kvpool.optimized.lifecycle.spec_decode import spec_step
from kvpool.optimized.lifecycle.swa_radix_lifecycle import (
    SWARadixLifecycle,
    UnifiedSWARadixLifecycle,
    UnifiedSWARadixLifecycleV0516,
)
from kvpool.optimized.options import TwinOptions, edge_options
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.optimized.radix_key import RadixKey
from kvpool.optimized.req import Req
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.optimized.swa.chunk_cache import SWAChunkCache
from kvpool.optimized.swa.kv_pool import SWAKVPool
from kvpool.optimized.swa.lifecycle import (
    evict_for_swa_alloc,
    free_kv_row_segment,
    free_swa_out_of_window_slots,
    slide_swa_window,
)
from kvpool.reference.lifecycle.stops import check_swa_stops
from kvpool.reference.lifecycle.swa_memory_manager import check_swa_config
from kvpool.reference.swa.lifecycle import swa_eviction_demand
from kvpool.snapshot import PoolSnapshot, SWAAllocatorSnapshot


class SWAMemoryManager(MemoryManager):
    """The lifecycle over SWA pools (see the module docstring). A public edge, as
    :class:`~kvpool.optimized.lifecycle.memory_manager.MemoryManager`: ``options`` or the
    shorthand ``device`` / ``checked`` / ``kernel_backend`` make one options value, handed to every
    pool and tree it builds."""

    def __init__(
        self,
        config: PoolConfig,
        clock: Callable[[], float] | None = None,
        device: str | torch.device | None = None,
        checked: bool | None = None,
        kernel_backend: str | None = None,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        window = check_swa_config(config)
        opts = edge_options(options, device, checked, kernel_backend)
        ps = config.page_size
        alloc = SWATokenToKVPoolAllocator(config.size, config.swa_size, ps, config.need_sort,
                                          rules=config.rules, options=opts)  # fmt: skip
        layers = range(config.num_layers)
        kv = SWAKVPool(config.size, config.swa_size, ps, "float32", config.head_num,
                       config.head_dim, [i for i in layers if i % 2], [i for i in layers
                       if not i % 2], config.v_head_dim, options=opts)  # fmt: skip
        kv.register_mapping(alloc.full_to_swa_index_mapping)

        scheduler = config.rules.swa_window_release == "scheduler"
        maybe_evict = config.rules.swa_window_release == "maybe_evict"

        def tree(
            cfg: PoolConfig, pool: ReqToTokenPool, a: SWATokenToKVPoolAllocator
        ) -> SWAChunkCache | SWARadixLifecycle:
            if cfg.disable_radix_cache:
                return SWAChunkCache(pool, a, ps, window, options=opts)
            if scheduler:
                return UnifiedSWARadixLifecycle(pool, a, ps, window, clock, cfg.eviction_policy,
                                                cfg.is_eagle, options=opts)  # fmt: skip
            if cfg.rules.swa_tree == "unified":
                return UnifiedSWARadixLifecycleV0516(pool, a, ps, window, clock,
                                                     cfg.eviction_policy, cfg.rules,
                                                     cfg.is_eagle, options=opts)  # fmt: skip
            return SWARadixLifecycle(pool, a, ps, window, clock, cfg.is_eagle, options=opts)

        super().__init__(
            config,
            clock,
            token_to_kv_pool_allocator=alloc,
            tree_cache=tree,
            kv_cache=kv,
            options=opts,
        )
        if isinstance(self.tree_cache, SWARadixLifecycle):
            self.tree_cache.evicted_of = lambda req: self.swa_evicted_seqlen(req.rid)
        self.sliding_window = window
        self._swa_evicted: dict[str, tuple[int, int, int]] = {}
        """rid -> (row, row generation, swa_evicted_seqlen): valid for that hand-out only."""
        self._session_swa: dict[str, int] = {}
        """session id -> the swa_evicted_seqlen of the turn whose row the session holds."""
        self._carrying: dict[str, int] = {}
        """rid -> the session's swa_evicted_seqlen, while an extend restores the turn (the
        window may slide inside that extend, before the row is the request's own)."""
        self.scheduler = scheduler
        """``Rules.swa_window_release == "scheduler"`` (SGLang 0.5.23's window and release)."""
        self.maybe_evict = maybe_evict
        """``Rules.swa_window_release == "maybe_evict"`` (SGLang 0.5.16's window timing)."""
        self.slides_early = scheduler or maybe_evict
        """Whether windows slide before an allocation (:meth:`_slide_windows`), not after a
        decode."""
        self._decodes: dict[str, tuple[int, int, int]] = {}
        """rid -> (row, row generation, decode steps since that hand-out): SGLang's
        ``decode_batch_idx`` (scheduler rule)."""
        self._branching: dict[str, int] = {}
        """rid -> SGLang's ``swa_branching_seqlen`` of its last match (scheduler rule)."""
        if scheduler and not self.tree_cache.disable:
            self.tree_cache.cache_unfinished_req = self._checkpoint_chunk  # type: ignore[method-assign]

    @property
    def _swa_allocator(self) -> SWATokenToKVPoolAllocator:
        """The token allocator, as the SWA allocator this manager built."""
        alloc = self.token_to_kv_pool_allocator
        assert isinstance(alloc, SWATokenToKVPoolAllocator)
        return alloc

    def swa_evicted_seqlen(self, rid: str) -> int:
        """Leading tokens of ``rid`` whose SWA slots its window released (0 without a row).
        InvalidArgumentError for an id that is not a ``str``."""
        req = self.reqs.get(as_str("rid", rid))
        if req is None or req.req_pool_idx is None:
            return 0
        row = req.req_pool_idx
        gen = self.req_to_token_pool.req_generation[row]
        kept = self._swa_evicted.get(rid)
        if kept is not None and kept[:2] == (row, gen):
            return kept[2]
        return self._carrying.get(rid, 0)

    def decode(self, rids: Sequence[str], token_ids: Sequence[int]) -> torch.Tensor:
        """The manager's decode, then every decoded request's window moves on (scheduler and
        maybe_evict rules: the window moved in :meth:`alloc_for_decode`)."""
        slots = super().decode(rids, token_ids)
        if self.slides_early:
            return slots
        alloc = self._swa_allocator
        for rid in rids:
            req = self.reqs[rid]
            row = req.req_pool_idx
            assert row is not None
            pre_len = req.kv_committed_len - 1  # the tokens before the one just decoded
            evicted = free_swa_out_of_window_slots(
                self.req_to_token_pool.read(row, 0, pre_len), self.swa_evicted_seqlen(rid),
                pre_len, req.cache_protected_len, self.sliding_window, self.page_size, alloc,
                is_chunk_cache=self.tree_cache.disable)  # fmt: skip
            self._swa_evicted[rid] = (row, self.req_to_token_pool.req_generation[row], evicted)
        return slots

    # ----------------------------------------------------------------- SGLang 0.5.23's window
    def _set_evicted(self, req: Req, evicted: int) -> None:
        row = req.req_pool_idx
        assert row is not None
        self._swa_evicted[req.rid] = (row, self.req_to_token_pool.req_generation[row], evicted)

    def decode_steps(self, rid: str) -> int:
        """Decode steps of ``rid`` since its row was handed out (SGLang's
        ``decode_batch_idx``; 0 without a row)."""
        req = self.reqs.get(as_str("rid", rid))
        if req is None or req.req_pool_idx is None:
            return 0
        row = req.req_pool_idx
        kept = self._decodes.get(rid)
        gen = self.req_to_token_pool.req_generation[row]
        return kept[2] if kept is not None and kept[:2] == (row, gen) else 0

    def _count_decode(self, reqs: Sequence[Req]) -> None:
        for req in reqs:
            row = req.req_pool_idx
            assert row is not None
            gen = self.req_to_token_pool.req_generation[row]
            self._decodes[req.rid] = (row, gen, self.decode_steps(req.rid) + 1)

    def _slide(self, req: Req, pre_len: int, window: int, sharing: bool) -> None:
        """:func:`slide_swa_window` of ``req`` before it computes token ``pre_len``."""
        assert req.req_pool_idx is not None
        row = self.req_to_token_pool.read(req.req_pool_idx, 0, max(pre_len, 0)).to(torch.int64)
        evicted = slide_swa_window(row, self.swa_evicted_seqlen(req.rid), pre_len,
                                   req.cache_protected_len, window, self.page_size,
                                   self._swa_allocator, sharing)  # fmt: skip
        self._set_evicted(req, evicted)

    def _slide_windows(self, reqs: Sequence[Req], pre_lens: Sequence[int] | None) -> None:
        """SGLang 0.5.23's ``ScheduleBatch.maybe_evict_swa``, in one free group (see the
        reference's); under the maybe_evict rule :meth:`_maybe_evict_windows`."""
        if self.maybe_evict:
            self._maybe_evict_windows(reqs, pre_lens)
            return
        alloc = self._swa_allocator
        sharing = not self.tree_cache.disable
        window = self.sliding_window
        alloc.free_group_begin()
        try:
            for i, req in enumerate(reqs):
                if req.req_pool_idx is None:
                    continue
                if pre_lens is None:
                    pre = req.kv_committed_len
                    due = pre - window >= self.swa_evicted_seqlen(req.rid) + (
                        self.config.rules.swa_eviction_interval
                    )
                    if self.decode_steps(req.rid) >= 1 and due:
                        self._slide(req, pre, window, sharing)
                elif not sharing:
                    self._slide(req, pre_lens[i], window, sharing)
        finally:
            alloc.free_group_end()

    def _maybe_evict_windows(self, reqs: Sequence[Req], pre_lens: Sequence[int] | None) -> None:
        """SGLang 0.5.16's ``ScheduleBatch.maybe_evict_swa`` (maybe_evict rule; no free group;
        see the reference's): a decode slides each request decoded before at its committed
        length, a prefill batch on the chunk cache each running request at its prefix
        length."""
        chunk = self.tree_cache.disable
        for i, req in enumerate(reqs):
            if req.req_pool_idx is None:
                continue
            if pre_lens is None:
                if self.decode_steps(req.rid) >= 1:
                    self._free_out_of_window(req, req.kv_committed_len)
            elif chunk and req.state == "running":
                self._free_out_of_window(req, pre_lens[i])

    def _free_out_of_window(self, req: Req, pre_len: int) -> None:
        """:func:`free_swa_out_of_window_slots` of ``req`` before it computes token
        ``pre_len``."""
        assert req.req_pool_idx is not None
        row = self.req_to_token_pool.read(req.req_pool_idx, 0, pre_len).to(torch.int64)
        evicted = free_swa_out_of_window_slots(
            row, self.swa_evicted_seqlen(req.rid), pre_len, req.cache_protected_len,
            self.sliding_window, self.page_size, self._swa_allocator,
            is_chunk_cache=self.tree_cache.disable)  # fmt: skip
        self._set_evicted(req, evicted)

    def alloc_for_extend(self, reqs: Sequence[Req], seq_lens: Sequence[int]) -> torch.Tensor:
        """Scheduler and maybe_evict rules: the checks, then the window slide of a prefill
        batch (:meth:`_slide_windows`), then the manager's allocation."""
        if self.slides_early:
            prefix_lens, seqs = self._check_extend(reqs, seq_lens)
            self._check_capacity(self._tokens_needed(prefix_lens, seqs))
            self._slide_windows(reqs, prefix_lens)
        return super().alloc_for_extend(reqs, seq_lens)

    def alloc_for_decode(self, reqs: Sequence[Req]) -> torch.Tensor:
        """Scheduler and maybe_evict rules: the checks, then the window slide of a decode
        batch (:meth:`_slide_windows`), then the manager's allocation; each request's decode
        step counts."""
        if not self.slides_early:
            return super().alloc_for_decode(reqs)
        _cols, needed = self._check_decode(reqs)
        if reqs:
            self._check_capacity(needed)
            self._slide_windows(reqs, None)
        out = super().alloc_for_decode(reqs)
        self._count_decode(reqs)
        return out

    def spec_step(
        self, rids: Sequence[str], accepted: Sequence[Sequence[int]], reserve: int
    ) -> torch.Tensor:
        """The manager's EAGLE v2 step; scheduler and maybe_evict rules: the windows slide
        after the step's checks, before its allocation (see the reference's)."""
        if not self.slides_early:
            return super().spec_step(rids, accepted, reserve)
        out = spec_step(self, rids, accepted, reserve, prepare=self._prepare_spec_step)
        self._count_decode([self.reqs[r] for r in rids])
        return out

    def _prepare_spec_step(self, reqs: list[Req], starts: list[int], ends: list[int]) -> None:
        """Before an EAGLE v2 step's allocation (scheduler, maybe_evict rules): capacity,
        then the decode batch's window slide (see the reference's)."""
        if starts:
            self._check_capacity(self._tokens_needed(starts, ends))
        if reqs:
            self._slide_windows(reqs, None)

    def _match(self, req: Req, cow: bool, load_back: bool) -> int:
        """The manager's match; under the scheduler rule with the radix cache, the request's
        ``swa_branching_seqlen`` is recorded for its next checkpoint."""
        restoring = self._restoring_session(req) is not None
        found = super()._match(req, cow, load_back)
        tree = self.tree_cache
        if self.scheduler and isinstance(tree, UnifiedSWARadixLifecycle) and not restoring:
            key = RadixKey.from_array(req.token_array(req.seq_len() - 1), req.extra_key)
            branching = tree.branching_seqlen(key, found)
            if branching is None:
                self._branching.pop(req.rid, None)
            else:
                self._branching[req.rid] = branching
        return found

    def _checkpoint(self, req: Req, up_to: int, finished: bool) -> None:
        """SGLang 0.5.23's ``checkpoint`` of ``req``'s first ``up_to`` tokens (see the
        reference's)."""
        tree = self.tree_cache
        assert isinstance(tree, UnifiedSWARadixLifecycle)
        eagle = int(tree.is_eagle)  # a bigram key spans one token more than its slots
        stop = up_to
        branching = self._branching.get(req.rid)
        if branching is not None and req.cache_protected_len < branching <= up_to - eagle:
            stop = branching + eagle
        window = self.sliding_window
        if not finished:
            self._slide(req, stop - eagle - 1, window, True)
        tree.checkpoint(req, stop, self.swa_evicted_seqlen(req.rid))
        if branching is not None and stop - eagle >= branching:
            self._branching.pop(req.rid, None)
            if not finished:
                self._slide(req, len(req.fill_ids) - eagle - 1, window, True)

    def _checkpoint_chunk(
        self, req: Req, chunked: bool = False, row_read: torch.Tensor | None = None
    ) -> None:
        """A chunk boundary (scheduler rule, radix cache): :meth:`_checkpoint` of the filled
        tokens; ``prefix_indices`` becomes ``row[:len(fill_ids)]``."""
        tree = self.tree_cache
        assert isinstance(tree, UnifiedSWARadixLifecycle)
        # the tree's hand-over checks (this replaces its cache_unfinished_req)
        tree._hand_over_args(req, "chunked", chunked, row_read, False)
        self._checkpoint(req, len(req.fill_ids), finished=False)
        row = req.req_pool_idx
        assert row is not None
        req.prefix_indices = self.req_to_token_pool.read(row, 0, len(req.fill_ids)).to(torch.int64)

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """Scheduler rule: SGLang 0.5.23's ``release_kv_cache`` (see the reference's)."""
        if not self.scheduler:
            super().release_kv_cache(req, is_insert)
            return
        req = as_instance("req", req, Req)
        is_insert = as_bool("is_insert", is_insert)
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        row = req.req_pool_idx
        before = req.kv_committed_len
        committed = before
        if self.config.rules.release_upto == "owned":  # a stop inside the last run
            committed = req.kv_committed_len = self._owned_len(req)
        if is_insert and not self.tree_cache.disable:
            try:
                self._checkpoint(req, committed, finished=True)
            except KVPoolError:  # refused before any change: the request is as it was
                req.kv_committed_len = before
                raise
        evicted = self.swa_evicted_seqlen(req.rid)
        protected = req.cache_protected_len
        alloc = self._swa_allocator
        own = self.req_to_token_pool.read(row, protected, committed).to(torch.int64)
        free_kv_row_segment(own, protected, evicted, protected, alloc)
        self.tree_cache.dec_lock_ref(req.last_node)
        start = ceil_align(committed, self.page_size)
        if req.kv_allocated_len > start:
            over = self.req_to_token_pool.read(row, start, req.kv_allocated_len).to(torch.int64)
            free_kv_row_segment(over, start, evicted, protected, alloc)
        self._branching.pop(req.rid, None)
        self.req_to_token_pool.free(req)
        req.reset_kv_fields()

    # ----------------------------------------------------------------- capacity (radix cache)
    def _check_capacity(self, needed: int) -> None:
        """With the radix cache: OutOfMemoryError unless each pool's free plus evictable tokens
        reach ``needed`` (the chunk cache: the manager's rule)."""
        tree = self.tree_cache
        if not isinstance(tree, SWARadixLifecycle):
            super()._check_capacity(needed)
            return
        alloc = self._swa_allocator
        full = alloc.full_available_size() + tree.evictable_size()
        swa = alloc.swa_available_size() + tree.swa_evictable_size()
        if min(full, swa) < needed:
            raise OutOfMemoryError(f"need {needed} tokens; full {full}, SWA {swa} with eviction")

    def _evict_for(self, needed: int, new_tokens: int = 0, batch_size: int = 0) -> None:
        """With the radix cache: check both pools for ``needed`` tokens, then evict each
        one's deficit against the rules' demand (:func:`swa_eviction_demand`)."""
        if not isinstance(self.tree_cache, SWARadixLifecycle):
            super()._evict_for(needed, new_tokens, batch_size)
            return
        self._check_capacity(needed)
        demand = swa_eviction_demand(self.config.rules, needed, new_tokens, batch_size,
                                     self.page_size)  # fmt: skip
        evict_for_swa_alloc(self.tree_cache, self.token_to_kv_pool_allocator, demand)

    def evict(self, num_tokens: int) -> int:
        """Evict ``num_tokens`` full tokens from the tree; returns the full tokens freed."""
        num_tokens = as_count("num_tokens", num_tokens)
        if isinstance(self.tree_cache, SWARadixLifecycle):
            return self.tree_cache.evict(num_tokens)[0]
        return super().evict(num_tokens)

    # ----------------------------------------------------------------- sessions
    def extend(
        self, rids: Sequence[str], chunk_sizes: Sequence[int | None] | None = None
    ) -> torch.Tensor:
        """The manager's extend; a session turn restored here carries on the session's window
        (its ``swa_evicted_seqlen``)."""
        rids = str_list("rids", rids)  # read below before the manager's own checks
        carried: dict[str, int] = {}
        for rid in rids:
            req = self.reqs.get(rid)
            if req is not None and self._restoring_session(req) is not None:
                assert req.session_id is not None
                carried[rid] = self._session_swa.get(req.session_id, 0)
        self._carrying = carried
        try:
            out = super().extend(rids, chunk_sizes)
            for rid in carried:
                req = self.reqs[rid]
                assert req.session_id is not None
                # a slide inside the extend recorded the cursor already
                self._set_evicted(req, self.swa_evicted_seqlen(rid))
                self._session_swa.pop(req.session_id, None)
        finally:
            self._carrying = {}
        return out

    def finish(
        self,
        rids: Sequence[str],
        is_insert: bool = True,
        finished_lens: Sequence[int | None] | None = None,
    ) -> None:
        """The manager's finish; a session turn hands its window to the session with its row.
        ConfigError for a stop a whole window or more before a request's last committed token,
        or at or below its window's cursor (the reference's)."""
        rids = str_list("rids", rids)  # read below before the manager's own checks
        handed: dict[str, int] = {}
        for rid in rids:
            req = self.reqs.get(rid)
            if req is not None and req.session_id is not None and self._session_of(req):
                handed[req.session_id] = self.swa_evicted_seqlen(rid)
        super().finish(rids, is_insert, finished_lens)
        self._session_swa.update(handed)

    def _check_stops(self, reqs: Sequence[Req], stops: Sequence[int | None]) -> None:
        """The reference's :func:`check_swa_stops` with this manager's window and cursors."""
        check_swa_stops(reqs, stops, self.sliding_window, self.swa_evicted_seqlen)

    def close_session(self, session_id: str) -> None:
        """The manager's close (the allocator's ``free`` releases the SWA slots still mapped).
        Scheduler rule, a session whose window slid past its protected prefix: the held
        columns go back as a release frees a row (:func:`free_kv_row_segment`), then the row."""
        session = self.sessions.get(as_str("session_id", session_id))
        evicted = self._session_swa.get(session_id, 0)
        if (self.scheduler and session is not None and session.busy_with is None
                and session.holds_kv() and evicted > session.cache_protected_len):  # fmt: skip
            row = session.req_pool_idx
            assert row is not None
            protected = session.cache_protected_len
            self.tree_cache.dec_lock_ref(session.last_node)
            held = self.req_to_token_pool.read(row, protected, session.kv_allocated_len)
            free_kv_row_segment(held.to(torch.int64), protected, evicted, protected,
                                self._swa_allocator)  # fmt: skip
            self.req_to_token_pool.free(session)
            session.forget()
            del self.sessions[session_id]
        else:
            super().close_session(session_id)
        self._session_swa.pop(session_id, None)

    def snapshot(self) -> PoolSnapshot:
        """The manager's snapshot with ``allocator`` the full pool's, ``swa`` both pools' and
        each request's ``swa_evicted_seqlen``."""
        # the SWA fields are set as each request and session is built (no second copy of each)
        snap = build_pool_snapshot(self, req_swa=self.swa_evicted_seqlen,
                                   session_swa=self._session_swa)  # fmt: skip
        swa = snap.allocator
        assert isinstance(swa, SWAAllocatorSnapshot)
        full = swa.full
        return dataclasses.replace(snap, allocator=full, swa=swa, max_total_num_tokens=full.size)


__all__ = ["SWAMemoryManager"]

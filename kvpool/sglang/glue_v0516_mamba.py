"""SGLang 0.5.16's scheduler glue for a hybrid (Mamba) model with the radix cache off:
:class:`SGLangMambaGlueManagerV0516`.

For a hybrid SSM model with ``--disable-radix-cache`` 0.5.16's registry builds a plain
``ChunkCache`` (``mem_cache/registry.py`` lines 84-88) over the ``HybridReqToTokenPool``; the
Mamba state is then the glue's alone:

=============================  ==========================================================
kvpool step                    SGLang 0.5.16 glue and what it does with the Mamba state
=============================  ==========================================================
``extend`` (admission)         ``allocation.alloc_for_extend`` -> ``alloc_req_slots``: the
                               headroom check (``len(reqs)`` slots, factor 1 without a
                               Mamba tree: nothing to evict), then the pool's ``alloc``:
                               the rows, then a slot (marked for a clear) and, with track
                               buffers, the ping-pong slots for every request holding none;
                               then the KV, as the full-attention family's
a chunk boundary               ``common.maybe_cache_unfinished_req`` -> ``ChunkCache.
                               cache_unfinished_req`` (``prefix_indices`` = the row's first
                               ``extend_range.end`` slots); the state stays with the request
``decode``, ``spec_step``      the full-attention family's glue (no Mamba work)
``finish`` / ``abort`` /       ``common.release_kv_cache``: ``ChunkCache.
``retract``                    cache_finished_req`` (frees ``row[cache_protected_len:
                               committed]``), the over-allocation, then, the tree not
                               managing Mamba states, ``free_mamba_cache`` (state and track
                               slots), the row, the record
=============================  ==========================================================

kvpool keeps what the scheduler decides before it calls the glue (admission: rows, tokens and
Mamba slots, which kvpool refuses when short where SGLang's pool asserts,
``Rules.mamba_slot_shortage``), the model's forward (the deferred clear of a fresh slot and the
state each forward writes: :mod:`kvpool.reference.mamba.lifecycle`'s ``prepare_forward`` /
``forward_state`` over SGLang's pool) and streaming sessions (a session's close gives its state
and track slots back through SGLang's ``free_mamba_cache`` first).

With the radix cache on, 0.5.16's registry builds its own ``UnifiedRadixCache`` (FULL+MAMBA,
``registry.py`` lines 114-115): :class:`SGLangMambaRadixGlueManagerV0516` drives the same glue
over it (:class:`SGLangUnified16MambaGlueTree`), where the tree does the Mamba work:

=============================  ==========================================================
kvpool step                    SGLang 0.5.16 code that runs
=============================  ==========================================================
``match_prefix``               the tree's ``match_prefix`` with ``cow_mamba`` and the
                               request (the MAMBA component's ``finalize_match_result``: a
                               slot and the copy, made at once), then ``inc_lock_ref``
``extend``'s own match         without ``cow_mamba``; once kvpool admits the batch, the
                               component's ``finalize_match_result`` with it
``extend`` (admission)         ``alloc_req_slots``: cached states evicted down to a headroom
                               of three slots per request, the rows and slots; then the KV
a chunk boundary               the unified ``cache_unfinished_req``: the state copied into a
                               fresh slot, inserted with the chunk, a second match, the row
                               rewritten, the lock moved
``finish`` / ``abort`` /       ``release_kv_cache``: the unified ``cache_finished_req`` (the
``retract``                    state donated to the end node, or the KV and slot freed),
                               the over-allocation, the row
an aborted waiting request     ``release_kv_cache``'s early path frees its copy-on-write slot
=============================  ==========================================================

The oracle is kvpool's lifecycle under ``Rules.for_sglang("0.5.16")`` (``mamba_tree="unified"``
with ``release_path="finished_req"``:
:class:`~kvpool.reference.unified.mamba_release.UnifiedMambaLifecycleCacheV0516`). Layer-wise
loading keeps kvpool's lifecycle over SGLang's token allocator (:func:`mamba_manager_v0516`,
:data:`~kvpool.sglang.glue_v0516.MAMBA_TREE_V0516`).

Requests reach SGLang as :class:`MambaGlueReqV0516`: 0.5.16's stand-in
(:class:`~kvpool.sglang.glue_v0516.GlueReqV0516`) with the Mamba fields on the request (0.5.23
keeps them on ``req.kv``) and ``extend_range``; with the radix cache on as
:class:`MambaRadixGlueReqV0516` (the unified cache's lock fields besides); any other field
still raises AttributeError.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError
from kvpool.optimized.lifecycle.mamba_hooks import MambaHooks
from kvpool.optimized.req import Req
from kvpool.reference.mamba import lifecycle as mamba_lifecycle
from kvpool.sglang.glue_mamba import SGLangHybridTable
from kvpool.sglang.glue_v0516 import (
    ChunkGlueReqV0516,
    SGLangChunkCacheV0516,
    SGLangGlueManagerV0516,
    covers_mamba_v0516,
)
from kvpool.sglang.loader import SGLangModules
from kvpool.tags import mamba_state_tag


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return int(value.reshape(-1)[0])
    return int(value)


class MambaGlueReqV0516(ChunkGlueReqV0516):
    """A kvpool hybrid request as SGLang 0.5.16's glue, ``HybridReqToTokenPool`` and
    ``ChunkCache`` see it: :class:`~kvpool.sglang.glue_v0516.GlueReqV0516` plus, SGLang's types
    on SGLang's side and kvpool's ints and lists on the request (as
    :class:`~kvpool.sglang.hybrid.MambaReqProxy` converts them):

    ==================================  ==================================================
    ``mamba_pool_idx`` (read / write)   ``mamba_pool_idx`` (a 0-d int64 tensor to SGLang)
    ``mamba_needs_clear`` (write)       ``mamba_needs_clear``
    ``mamba_ping_pong_track_buffer``    ``mamba_ping_pong_track_buffer`` (an int64 tensor)
    ``mamba_next_track_idx``            ``mamba_next_track_idx``
    ``extend_range`` (read)             as :class:`~kvpool.sglang.glue_v0516.ChunkGlueReqV0516`
    ==================================  ==================================================
    """

    __slots__ = ()

    @property
    def mamba_pool_idx(self) -> torch.Tensor | None:
        slot = self.req.mamba_pool_idx
        return None if slot is None else torch.tensor(int(slot), dtype=torch.int64)

    @mamba_pool_idx.setter
    def mamba_pool_idx(self, value: Any) -> None:
        self.req.mamba_pool_idx = _opt_int(value)

    @property
    def mamba_needs_clear(self) -> bool:
        return bool(self.req.mamba_needs_clear)

    @mamba_needs_clear.setter
    def mamba_needs_clear(self, value: bool) -> None:
        self.req.mamba_needs_clear = bool(value)

    @property
    def mamba_ping_pong_track_buffer(self) -> torch.Tensor | None:
        track = self.req.mamba_ping_pong_track_buffer
        return None if track is None else torch.tensor(list(track), dtype=torch.int64)

    @mamba_ping_pong_track_buffer.setter
    def mamba_ping_pong_track_buffer(self, value: Any) -> None:
        self.req.mamba_ping_pong_track_buffer = (
            None if value is None else [int(s) for s in value.tolist()]
        )

    @property
    def mamba_next_track_idx(self) -> int | None:
        return _opt_int(self.req.mamba_next_track_idx)

    @mamba_next_track_idx.setter
    def mamba_next_track_idx(self, value: Any) -> None:
        self.req.mamba_next_track_idx = _opt_int(value)


class ChunkMambaHooks(MambaHooks):
    """The twin's Mamba hooks over SGLang's hybrid pool without a Mamba tree: the scheduler's
    part (the forward's deferred clear of a fresh slot and the state each forward writes)
    through :mod:`kvpool.reference.mamba.lifecycle`, which takes the adapter's lists; slots are
    taken and freed by SGLang's glue (:meth:`before_release` is not called by this manager)."""

    def __init__(self, pool: SGLangHybridTable) -> None:
        super().__init__(pool)  # type: ignore[arg-type]
        self.glue_pool = pool

    def after_admission(self, reqs: Sequence[Req]) -> None:
        mamba_lifecycle.prepare_forward(self.glue_pool, reqs)  # type: ignore[arg-type]

    def after_write(self, req: Req, stop: int) -> None:
        self.after_writes([req], [stop])

    def after_writes(self, reqs: Sequence[Req], stops: Sequence[int]) -> None:
        if not reqs:
            return
        tags = [
            mamba_state_tag(r.all_token_ids[:s], r.extra_key) if s > 0 else 0
            for r, s in zip(reqs, stops, strict=True)
        ]
        mamba_lifecycle.forward_state(self.glue_pool, list(reqs), tags)  # type: ignore[arg-type]

    def release_waiting(self, req: Req) -> None:
        """A waiting request holds no Mamba slot without a tree (no copy-on-write)."""
        if req.mamba_pool_idx is not None:
            mamba_lifecycle.release_waiting(self.glue_pool, req)  # type: ignore[arg-type]


class SGLangMambaGlueManagerV0516(SGLangGlueManagerV0516):
    """The glue lifecycle of a hybrid model with the radix cache off over SGLang 0.5.16 (module
    docstring). Built as ``SGLangMambaGlueManagerV0516(config, modules,
    token_to_kv_pool_allocator=...)``: SGLang's hybrid pool of ``config.mamba_slots`` slots,
    its token allocator (kvpool's adapter or its factory) and SGLang's ``ChunkCache`` over
    them. InvalidArgumentError for a configuration :func:`covers_mamba_v0516` refuses."""

    def __init__(
        self, config: PoolConfig, modules: SGLangModules, *, token_to_kv_pool_allocator: Any
    ) -> None:
        if not self._covers(config) or config.mamba_slots is None:
            raise InvalidArgumentError(
                f"{type(self).__name__} does not drive this configuration "
                "(covers_mamba_v0516 / covers_mamba_radix_v0516)"
            )
        slots = config.mamba_slots

        def table(cfg: PoolConfig) -> SGLangHybridTable:
            return SGLangHybridTable(modules, cfg.req_pool_size, cfg.max_context_len, slots,
                                     cfg.mamba_layers, cfg.mamba_track_buffers)  # fmt: skip

        def tree(cfg: PoolConfig, pool: Any, alloc: Any) -> Any:
            return self._build_tree(modules, cfg, pool, alloc)

        super().__init__(config, modules, token_to_kv_pool_allocator=token_to_kv_pool_allocator,
                         req_to_token_pool=table, tree_cache=tree)  # fmt: skip
        pool: Any = self.req_to_token_pool
        self.hooks = self._build_hooks(pool)
        self.mamba_hooks = self.hooks
        self.mamba_glue: Counter[str] = Counter()
        """The Mamba paths of SGLang's glue taken (``mamba.NAME``; coverage tags)."""
        self.glue_calls.append(self.mamba_glue)

    @staticmethod
    def _covers(config: PoolConfig) -> bool:
        """Whether this manager drives ``config`` (:func:`covers_mamba_v0516`)."""
        return covers_mamba_v0516(config)

    def _build_tree(self, modules: SGLangModules, cfg: PoolConfig, pool: Any, alloc: Any) -> Any:
        """The tree 0.5.16's registry builds: its ``ChunkCache`` (radix cache off)."""
        return SGLangChunkCacheV0516(modules, pool, alloc, cfg.page_size, cfg.eviction_policy,
                                     rules=cfg.rules)  # fmt: skip

    def _build_hooks(self, pool: Any) -> ChunkMambaHooks:
        """The scheduler's Mamba work over SGLang's pool (no Mamba tree)."""
        return ChunkMambaHooks(pool)

    def _glue(self, req: Req) -> MambaGlueReqV0516:  # type: ignore[override]
        self._bind()
        tree: Any = self.tree_cache
        return MambaGlueReqV0516(req, self._records, tree._inserted)

    # ----------------------------------------------------------------- primitives
    def alloc_for_extend(self, reqs: Sequence[Req], seq_lens: Sequence[int]) -> torch.Tensor:
        """kvpool's checks (the twin's, Mamba slots included: refused before any change), then
        SGLang's ``alloc_for_extend`` (the pool's rows and Mamba slots inside
        ``alloc_req_slots``, then the KV), then the forward's deferred clear of the fresh
        slots."""
        prefix_lens, seqs = self._check_extend(reqs, seq_lens)
        self.hooks.check_admission(reqs)
        self._check_capacity(self._tokens_needed(prefix_lens, seqs))
        pool: Any = self.req_to_token_pool
        fresh = pool.mamba_slots_needed(reqs)
        out = super().alloc_for_extend(reqs, seq_lens)
        if fresh:
            self.mamba_glue["mamba.slots_in_alloc_req_slots"] += 1
        self.hooks.after_admission(reqs)
        return out

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """SGLang 0.5.16's ``release_kv_cache``: the chunk cache frees the request's own KV,
        ``free_mamba_cache`` its state and track slots (the tree does not manage states), the
        row and the record go."""
        held = req.mamba_pool_idx is not None
        super().release_kv_cache(req, is_insert)
        if held and req.mamba_pool_idx is None:
            self.mamba_glue["mamba.freed_in_release_kv_cache"] += 1

    def close_session(self, session_id: str) -> None:
        """kvpool's session close; a hybrid session's Mamba state and track slots go back
        through SGLang's ``free_mamba_cache`` first (while the session still holds its row,
        whose track mapping SGLang reads), once the close is known to proceed."""
        session = self.sessions.get(session_id)
        if session is not None and session.busy_with is None and session.mamba_pool_idx is not None:
            pool: Any = self.req_to_token_pool
            pool.impl.free_mamba_cache(self._glue(session))  # type: ignore[arg-type]
        super().close_session(session_id)


__all__ = [
    "ChunkMambaHooks",
    "MambaGlueReqV0516",
    "SGLangMambaGlueManagerV0516",
]

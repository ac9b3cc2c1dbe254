"""``SGLangMambaGlueManager``: the glue lifecycle of a hybrid (Mamba) model over SGLang 0.5.23.

A hybrid SSM model's memory in SGLang 0.5.23 is a ``HybridReqToTokenPool`` (a row and a Mamba
state slot per request, maybe ping-pong track slots), the token allocator, and a
``UnifiedRadixCache`` with the FULL and MAMBA components: the registry builds that cache for a
hybrid model whether the radix cache is on or off (off: a disabled one, which keeps nothing
but still frees the request's Mamba state through its MAMBA component). This manager is
:class:`~kvpool.sglang.glue_manager.SGLangGlueManager` over those three, so that SGLang's own
glue does the Mamba work too:

=============================  ==========================================================
kvpool step                    SGLang's glue and what it does with the Mamba state
=============================  ==========================================================
``match_prefix`` (tree on)     ``match_kv_cache(cow_mamba=True)``: the MAMBA component gives
                               the request a slot of its own (evicting one state, the node
                               locked meanwhile, when none is free) and records the copy,
                               which kvpool's forward step makes at once
``extend``'s own match and     ``match_kv_cache`` without ``cow_mamba``, then, once kvpool
its copy-on-write (tree on)    admits the batch, the MAMBA component's
                               ``finalize_match_result_in_cache`` with ``cow_mamba`` on that
                               match (what the same match with ``cow_mamba`` runs last)
``extend`` (admission)         ``alloc_for_extend`` -> ``alloc_req_slots`` ->
                               ``ensure_mamba_capacity`` (counts the slots and track slots
                               the batch needs; a Mamba-capable tree is asked to evict
                               states when too few are free), then the pool's ``alloc``
                               gives every request without one a slot marked for a clear
                               (and its track slots); then the KV
a chunk boundary (tree on)     ``checkpoint_kv_cache``: a fresh slot gets a copy of the
                               state and goes into the tree with the chunk
``finish``                     ``release_kv_cache(checkpoint=True)``: the tree's
                               ``checkpoint`` of a finished request hands the state to the
                               MAMBA component: the end node keeps it (tree on; freed when
                               the node has one) or it is freed with the track slots
                               through ``free_mamba_cache`` (disabled tree)
``abort`` / ``retract``        ``release_kv_cache(checkpoint=False)``: the tree's
                               ``on_release`` frees the state the same way
``abort`` of a waiting         ``release_kv_cache``'s early path frees the state alone
request holding a
copy-on-write slot (tree on)
=============================  ==========================================================

kvpool keeps, as for any model, what the scheduler decides before it calls the glue: the
admission checks (rows, tokens, and here Mamba slots: kvpool refuses a batch whose slots are
short, where SGLang's pool asserts, ``Rules.mamba_slot_shortage``), the model's forward (the
deferred clear of a fresh slot and the state tag each forward writes:
:mod:`kvpool.reference.mamba.lifecycle`'s ``prepare_forward`` / ``forward_state``, the
scheduler's part, run over SGLang's pool) and streaming sessions.

Scope: the radix cache off and on. With it on, kvpool's reference is 0.5.23's unified tree in
the lifecycle (:class:`~kvpool.reference.unified.mamba_release.UnifiedMambaLifecycleCache`,
``Rules.mamba_tree == "unified"``), page size 1, no track slots, no sessions (as kvpool's
reference: :func:`kvpool.reference.lifecycle.mamba_hooks.check_hybrid_config`). Where SGLang asserts
(a copy-on-write that finds no slot even by evicting a state) kvpool leaves the request without one
(``Rules.mamba_slot_shortage``), so the glue asks ``match_kv_cache`` for ``cow_mamba`` only when a
slot is free and otherwise finishes the match itself when eviction can give one. ``mamba_glue``
counts the Mamba paths taken (coverage tags ``sglang:mamba.NAME``).

Requests reach SGLang as :class:`MambaGlueReq` (a :class:`~kvpool.sglang.glue.GlueReq` whose
``kv`` also maps the Mamba fields; unknown ones still raise).
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError, RowReuseError
from kvpool.optimized.lifecycle.mamba_hooks import MambaHooks
from kvpool.optimized.req import Req
from kvpool.reference.mamba import lifecycle as mamba_lifecycle
from kvpool.sglang.cache_req import InsertedLen
from kvpool.sglang.glue import GlueKv, GlueReq
from kvpool.sglang.glue_manager import SGLangGlueManager
from kvpool.sglang.hybrid import MambaReqProxy, SGLangHybridReqToTokenPool
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.unified_base import UnifiedTreeBase
from kvpool.sglang.unified_mamba_radix import SGLangUnifiedMambaRadixCache, install_mamba_runtime
from kvpool.sglang.unified_radix import SGLangUnifiedRadixCache
from kvpool.snapshot import MambaTreeSnapshot, TreeSnapshot
from kvpool.tags import mamba_state_tag

_MAMBA_ROWS: Any = SGLangUnifiedMambaRadixCache
"""The FULL+MAMBA adapter, whose snapshot rows the glue tree reuses (same SGLang object)."""

EXTRA_FIELDS = frozenset({
    "mamba_last_track_idx", "mamba_last_track_seqlen", "mamba_prev_track_seqlen",
})  # fmt: skip
"""``req.kv`` fields SGLang's hybrid pool keeps for its track buffers that kvpool's request
does not have: kept per request by :class:`MambaExtras`, readable back."""


class MambaExtras:
    """The :data:`EXTRA_FIELDS` of each request (forgotten when its KV is released)."""

    def __init__(self) -> None:
        self._fields: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()

    def get(self, req: Any, name: str) -> Any:
        return self._fields.get(req, {}).get(name)

    def set(self, req: Any, name: str, value: Any) -> None:
        self._fields.setdefault(req, {})[name] = value

    def forget(self, req: Any) -> None:
        self._fields.pop(req, None)


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return int(value.reshape(-1)[0])
    return int(value)


class MambaGlueKv(GlueKv):
    """``req.kv`` of a :class:`MambaGlueReq`: :class:`GlueKv` plus the Mamba fields, SGLang's
    types on SGLang's side (``mamba_pool_idx`` a 0-d int64 tensor, the track buffer an int64
    tensor), kvpool's ints and lists on the request."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name in EXTRA_FIELDS:
            return self._extras.get(self._owner.req, name)
        raise AttributeError(f"SGLang read kv.{name!r}, which kvpool's request does not map")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in EXTRA_FIELDS:
            self._extras.set(self._owner.req, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def _extras(self) -> MambaExtras:
        owner: Any = self._owner
        extras: MambaExtras = owner.extras
        return extras

    @property
    def holds_mamba(self) -> bool:
        return self._owner.req.mamba_pool_idx is not None

    @property
    def mamba_pool_idx(self) -> torch.Tensor | None:
        slot = self._owner.req.mamba_pool_idx
        return None if slot is None else torch.tensor(int(slot), dtype=torch.int64)

    @mamba_pool_idx.setter
    def mamba_pool_idx(self, value: Any) -> None:
        self._owner.req.mamba_pool_idx = _opt_int(value)

    @property
    def mamba_needs_clear(self) -> bool:
        return bool(self._owner.req.mamba_needs_clear)

    @mamba_needs_clear.setter
    def mamba_needs_clear(self, value: bool) -> None:
        self._owner.req.mamba_needs_clear = bool(value)

    @property
    def mamba_cow_src_index(self) -> torch.Tensor | None:
        slot = self._owner.req.mamba_cow_src_index
        return None if slot is None else torch.tensor([int(slot)], dtype=torch.int64)

    @mamba_cow_src_index.setter
    def mamba_cow_src_index(self, value: Any) -> None:
        self._owner.req.mamba_cow_src_index = _opt_int(value)

    @property  # type: ignore[override]
    def mamba_ping_pong_track_buffer(self) -> torch.Tensor | None:
        track = self._owner.req.mamba_ping_pong_track_buffer
        return None if track is None else torch.tensor(list(track), dtype=torch.int64)

    @mamba_ping_pong_track_buffer.setter
    def mamba_ping_pong_track_buffer(self, value: Any) -> None:
        self._owner.req.mamba_ping_pong_track_buffer = (
            None if value is None else [int(s) for s in value.tolist()]
        )

    @property
    def mamba_ping_pong_empty(self) -> list[bool] | None:
        """Which track entries hold no slot: SGLang keeps this list beside the buffer, whose
        empty entries are -1 (``set_mamba_ping_pong_slot`` writes both), so kvpool derives it
        from the buffer (a session's turn carries the buffer, not the list)."""
        track = self._owner.req.mamba_ping_pong_track_buffer
        return None if track is None else [int(s) == -1 for s in track]

    @mamba_ping_pong_empty.setter
    def mamba_ping_pong_empty(self, value: Any) -> None:
        """Nothing to store: derived from the track buffer SGLang writes with it."""

    @property
    def mamba_next_track_idx(self) -> int | None:
        return _opt_int(self._owner.req.mamba_next_track_idx)

    @mamba_next_track_idx.setter
    def mamba_next_track_idx(self, value: Any) -> None:
        self._owner.req.mamba_next_track_idx = _opt_int(value)


class MambaGlueReq(GlueReq):
    """A kvpool hybrid request as SGLang 0.5.23's glue sees it: :class:`GlueReq` whose ``kv``
    is a :class:`MambaGlueKv`; ``extras`` keeps SGLang's track-buffer bookkeeping."""

    __slots__ = ("extras",)
    extras: MambaExtras

    def __init__(self, req: Any, extras: MambaExtras, *args: Any) -> None:
        super().__init__(req, *args)
        object.__setattr__(self, "extras", extras)

    @property
    def kv(self) -> MambaGlueKv:
        return MambaGlueKv(self)


class SGLangHybridTable(SGLangHybridReqToTokenPool):
    """SGLang's ``HybridReqToTokenPool`` with the request-table calls kvpool's lifecycle makes
    on its ``req_to_token_pool`` (``write``, ``read``, ``alloc`` / ``free`` refusing misuse as
    :class:`~kvpool.sglang.req_to_token.SGLangReqToTokenPool` does)."""

    def alloc(self, reqs: Sequence[Any]) -> list[int] | None:
        try:
            rows = self.impl.alloc([MambaReqProxy(r) for r in reqs])
        except AssertionError as exc:
            raise RowReuseError(f"SGLang refused the batch: {exc}") from None
        return None if rows is None else [int(r) for r in rows]

    def free(self, req: Any) -> None:
        try:
            self.impl.free(MambaReqProxy(req))
        except AssertionError as exc:
            raise InvalidArgumentError(f"SGLang refused the free: {exc}") from None

    def write(self, index: tuple[int, slice], values: Any) -> None:
        """``req_to_token[row, start:stop] = values`` through SGLang's ``write``."""
        tensor = values if isinstance(values, torch.Tensor) else torch.tensor(list(values))
        self.impl.write(index, tensor.to(torch.int32))

    def read(self, row: int, start: int, stop: int) -> torch.Tensor:
        """A copy of ``req_to_token[row, start:stop]`` (int32)."""
        table: torch.Tensor = self.impl.req_to_token
        return table[row, start:stop].clone()


class SGLangMambaGlueTree(SGLangUnifiedRadixCache):
    """SGLang 0.5.23's ``UnifiedRadixCache`` with the FULL and MAMBA components, as its
    registry builds it for a hybrid model, behind the FULL adapter's calls (the lifecycle's
    tree). ``disable``: the radix cache off (a disabled cache; the only setting the lockstep
    drives, see the module docstring)."""

    def __init__(
        self,
        modules: Any,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int,
        disable: bool = False,
        eviction_policy: str = "lru",
        tree_core: str = "rust",
        is_eagle: bool = False,
    ) -> None:
        install_mamba_runtime(modules)
        self.page_size = page_size
        self.disable = disable
        self.eviction_policy = eviction_policy.lower()
        self._inserted = InsertedLen()
        UnifiedTreeBase._build(
            self,
            modules,
            tree_core,
            ("full", "mamba"),
            disable=disable,
            req_to_token_pool=getattr(req_to_token_pool, "impl", req_to_token_pool),
            token_to_kv_pool_allocator=getattr(
                token_to_kv_pool_allocator, "impl", token_to_kv_pool_allocator
            ),
            page_size=page_size,
            eviction_policy=eviction_policy,
            is_eagle=is_eagle,
        )
        # SGLang's own choice: a tree with a MAMBA component keeps token keys under EAGLE
        self.is_eagle = bool(self.impl.tree_core.is_eagle)
        self._tree_lock = self._lock_of
        self._mamba = self._unified.component_type.MAMBA

    _state = _MAMBA_ROWS._state
    _python_lru = _MAMBA_ROWS._python_lru

    @property
    def mamba_component(self) -> Any:
        """SGLang's ``MambaComponent`` of this cache."""
        return self.impl.components[self._mamba]

    def mamba_evictable_size(self) -> int:
        """Unlocked cached states (the lifecycle's admission counts them)."""
        return int(self.impl.mamba_evictable_size())

    def mamba_state(self, node: Any) -> int | None:
        """The state slot ``node`` (a ``NodeId``) caches, None for a tombstone or the root."""
        got = self.impl.tree_core.get_component_device_value(int(node), self._mamba)
        return None if got is None else int(got.reshape(-1)[0])

    def snapshot(self) -> TreeSnapshot | MambaTreeSnapshot:  # type: ignore[override]
        """Disabled: the FULL adapter's snapshot. Enabled: the FULL+MAMBA adapter's
        (:meth:`~kvpool.sglang.unified_mamba_radix.SGLangUnifiedMambaRadixCache.snapshot`),
        marked ``unified`` as kvpool's lifecycle model of this tree marks its own."""
        if self.disable:
            return super().snapshot()
        rows, full_lru, mamba_lru = (
            _MAMBA_ROWS._python_rows(self)
            if self.tree_core == "python"
            else _MAMBA_ROWS._rust_rows(self)
        )
        impl = self.impl
        return MambaTreeSnapshot(
            full_evictable_size=int(impl.full_evictable_size()),
            mamba_evictable_size=int(impl.mamba_evictable_size()),
            full_protected_size=int(impl.full_protected_size()),
            mamba_protected_size=int(impl.mamba_protected_size()),
            nodes=tuple(rows),
            full_lru=full_lru,
            mamba_lru=mamba_lru,
            unified=True,
        )


class GlueMambaHooks(MambaHooks):
    """The twin's Mamba hooks over SGLang's hybrid pool: the scheduler's part (the forward's
    deferred clear and state writes, the copy a copy-on-write records) through
    :mod:`kvpool.reference.mamba.lifecycle`, which takes the adapter's lists; the tree's parts
    (copy-on-write at admission, the early free of a waiting request's slot) are SGLang's,
    through ``manager``; the release is SGLang's glue (:meth:`before_release` is not called
    by this manager)."""

    def __init__(self, pool: Any, manager: SGLangMambaGlueManager) -> None:
        super().__init__(pool)
        self.glue_pool: SGLangHybridTable = pool
        self.manager = manager

    def stage_cow(self, reqs: Sequence[Req]) -> None:
        """Copy-on-write at admission of the requests ``extend`` matched itself: SGLang's
        ``MambaComponent`` finishes the match (:meth:`SGLangMambaGlueManager.finish_cow`)."""
        if self.tree is None:
            return
        for req in reqs:
            if req.mamba_pool_idx is None and req.last_node is not None:
                self.manager.finish_cow(req, "mamba.cow_at_admission")

    def evict_for_admission(self, reqs: Sequence[Req]) -> None:
        """Nothing: SGLang's ``ensure_mamba_capacity`` evicts inside ``alloc_for_extend``."""

    def reclaim_before_alloc(self, reqs: Sequence[Req]) -> None:
        """Nothing: SGLang's ``ensure_mamba_capacity`` evicts inside ``alloc_for_extend``."""

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
        """A waiting request holding a copy-on-write slot leaves: SGLang's
        ``release_kv_cache``'s early path (no row) frees the slot with the tree on; kvpool's
        ``release_waiting`` otherwise (a waiting request then holds none)."""
        if req.mamba_pool_idx is None:
            return
        if self.tree is not None:
            self.manager.early_free(req)
        else:
            mamba_lifecycle.release_waiting(self.glue_pool, req)  # type: ignore[arg-type]


class SGLangMambaGlueManager(SGLangGlueManager):
    """The glue lifecycle of a hybrid model (module docstring). Built as
    ``SGLangMambaGlueManager(config, modules, tree_core="rust")``: SGLang's hybrid pool of
    ``config.mamba_slots`` slots, its token allocator (``token_to_kv_pool_allocator``, kvpool's
    adapter or its factory) and the FULL+MAMBA unified cache over them."""

    def __init__(
        self,
        config: PoolConfig,
        modules: SGLangModules,
        *,
        token_to_kv_pool_allocator: Any,
        tree_core: str = "rust",
    ) -> None:
        if config.mamba_slots is None:
            raise InvalidArgumentError("SGLangMambaGlueManager needs config.mamba_slots")
        slots = config.mamba_slots

        def table(cfg: PoolConfig) -> SGLangHybridTable:
            return SGLangHybridTable(modules, cfg.req_pool_size, cfg.max_context_len, slots,
                                     cfg.mamba_layers, cfg.mamba_track_buffers)  # fmt: skip

        def tree(cfg: PoolConfig, pool: Any, alloc: Any) -> SGLangMambaGlueTree:
            return SGLangMambaGlueTree(modules, pool, alloc, cfg.page_size,
                                       disable=cfg.disable_radix_cache,
                                       eviction_policy=cfg.eviction_policy,
                                       tree_core=tree_core, is_eagle=cfg.is_eagle)  # fmt: skip

        super().__init__(config, modules, token_to_kv_pool_allocator=token_to_kv_pool_allocator,
                         req_to_token_pool=table, tree_cache=tree)  # fmt: skip
        self._modules = modules
        self.extras = MambaExtras()
        """SGLang's track-buffer bookkeeping per request (:data:`EXTRA_FIELDS`)."""
        self.hooks = GlueMambaHooks(self.req_to_token_pool, self)
        self.mamba_hooks = self.hooks
        self.glue_tree: SGLangMambaGlueTree = self.tree_cache  # type: ignore[assignment]
        self.tree_on = not config.disable_radix_cache
        """The radix cache is on: the tree keeps states (copy-on-write, checkpoints)."""
        if self.tree_on:
            tree_for_hooks: Any = self.glue_tree  # its mamba_evictable_size counts at admission
            self.hooks.tree = tree_for_hooks
        self.mamba_glue: Counter[str] = Counter()
        """The Mamba paths of SGLang's glue taken (``mamba.NAME``; coverage tags)."""
        self.glue_calls.append(self.mamba_glue)
        self._matches: weakref.WeakKeyDictionary[Req, Any] = weakref.WeakKeyDictionary()
        """Each waiting request's last ``match_kv_cache`` result (a copy-on-write at admission
        finishes it)."""

    def _glue(self, req: Req) -> MambaGlueReq:
        tree: Any = self.tree_cache
        return MambaGlueReq(req, self.extras, tree._inserted, tree._tree_lock,
                            getattr(tree, "node_ref", None))  # fmt: skip

    # ----------------------------------------------------------------- copy-on-write
    def _cow_mamba(self, req: Req, cow: bool) -> bool:
        """``match_kv_cache(cow_mamba=True)`` when the tree is on, a copy-on-write is asked for
        and a slot is free; with none free SGLang would assert when eviction cannot give one
        either, so the match goes without and :meth:`_after_match` finishes it."""
        pool: Any = self.req_to_token_pool
        free = int(pool.impl.mamba_allocator.available_size())
        return self.tree_on and cow and (req.mamba_pool_idx is not None or free > 0)

    def _after_match(self, req: Req, result: Any, cow: bool) -> None:
        """Keep the match for a copy-on-write at admission; a copy-on-write asked for but left
        undone (no free slot) is finished by :meth:`finish_cow`; a recorded copy is made at
        once, as kvpool's lifecycle makes it (the checkpoint is locked and never written)."""
        if not self.tree_on:
            return
        self._matches[req] = result
        if cow and req.mamba_cow_src_index is None:
            self.finish_cow(req, "mamba.cow_after_match")
        elif cow and req.mamba_cow_src_index is not None:
            self.mamba_glue["mamba.cow_in_match"] += 1
            mamba_lifecycle.prepare_forward(self.req_to_token_pool, [req])  # type: ignore[arg-type]

    def finish_cow(self, req: Req, label: str) -> None:
        """SGLang's copy-on-write of the state the request's last match found (its
        ``MambaComponent.finalize_match_result_in_cache`` with ``cow_mamba``: a slot, evicting
        one state with the node locked when none is free), then the copy. Nothing when the
        node caches no state, or when no slot can be had even by eviction (SGLang asserts
        there, ``Rules.mamba_slot_shortage``; kvpool's rule leaves the request without one)."""
        result = self._matches.get(req)
        if result is None:
            return
        tree = self.glue_tree
        node = result.best_match_node
        if tree.mamba_state(node) is None:
            return
        pool: Any = self.req_to_token_pool
        if req.mamba_pool_idx is None and int(pool.impl.mamba_allocator.available_size()) == 0:
            own = 1 if tree.open_locks(node) == 0 else 0  # its own state is locked meanwhile
            if tree.mamba_evictable_size() - own <= 0:
                return
        params = self._modules.attr("sglang.srt.mem_cache.base_prefix_cache", "MatchPrefixParams")(
            key=None, cow_mamba=True, req=self._glue(req)
        )
        with tree._call():
            tree.mamba_component.finalize_match_result_in_cache(params, result)
        self.mamba_glue[label] += 1
        mamba_lifecycle.prepare_forward(pool, [req])

    def early_free(self, req: Req) -> None:
        """A waiting request's copy-on-write slot back through SGLang's ``release_kv_cache``
        (its early path for a request holding a state but no row)."""
        tree: Any = self.tree_cache
        self._common.release_kv_cache(self._glue(req), tree.impl, checkpoint=False)
        self.mamba_glue["mamba.early_free"] += 1

    # ----------------------------------------------------------------- primitives
    def alloc_for_extend(self, reqs: Sequence[Req], seq_lens: Sequence[int]) -> torch.Tensor:
        """kvpool's checks (the twin's, Mamba slots included: refused before any change), then
        SGLang's ``alloc_for_extend`` (``ensure_mamba_capacity`` and the pool's Mamba slots
        inside ``alloc_req_slots``), then the forward's deferred clear of the fresh slots."""
        prefix_lens, seqs = self._check_extend(reqs, seq_lens)
        self.hooks.check_admission(reqs)
        self._check_capacity(self._tokens_needed(prefix_lens, seqs))
        if self.tree_on:
            pool: Any = self.req_to_token_pool
            if int(pool.impl.mamba_allocator.available_size()) < pool.mamba_slots_needed(reqs):
                self.mamba_glue["mamba.ensure_capacity_evicts"] += 1
        out = self._sglang_extend(self._glue_batch(reqs).for_extend(prefix_lens, seqs), seqs)
        self.hooks.after_admission(reqs)
        return out

    def close_session(self, session_id: str) -> None:
        """kvpool's session close; a hybrid session's Mamba state and track slots go back
        through SGLang's ``free_mamba_cache`` first (while the session still holds its row,
        whose track mapping SGLang reads), once the close is known to proceed."""
        session = self.sessions.get(session_id)
        if session is not None and session.busy_with is None and session.mamba_pool_idx is not None:
            pool: Any = self.req_to_token_pool
            pool.impl.free_mamba_cache(self._glue(session))  # type: ignore[arg-type]
        super().close_session(session_id)

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """SGLang's ``release_kv_cache`` (the tree frees the Mamba state and track slots);
        SGLang's track bookkeeping of the request is forgotten with its other fields."""
        before = self._cached_states()
        super().release_kv_cache(req, is_insert)
        self.extras.forget(req)
        if is_insert and self._cached_states() > before:
            self.mamba_glue["mamba.checkpoint_donated"] += 1

    def _cached_states(self) -> int:
        """States the tree caches (0 with the tree off)."""
        if not self.tree_on:
            return 0
        impl = self.glue_tree.impl
        return int(impl.mamba_evictable_size()) + int(impl.mamba_protected_size())


__all__ = [
    "EXTRA_FIELDS",
    "GlueMambaHooks",
    "MambaExtras",
    "MambaGlueKv",
    "MambaGlueReq",
    "SGLangHybridTable",
    "SGLangMambaGlueManager",
    "SGLangMambaGlueTree",
]

"""The lifecycle's Mamba hooks: what a hybrid model adds to every lifecycle path.

:class:`~kvpool.reference.lifecycle.primitives.LifecyclePrimitives` builds a
:class:`MambaHooks` when ``config.mamba_slots`` is set (its request table is then a
:class:`~kvpool.reference.mamba.hybrid_req_to_token_pool.HybridReqToTokenPool`) and calls it at four
points, so that the lifecycle files carry one line per point:

- :meth:`check_admission`, before an extend changes anything: every request that needs a Mamba
  slot (and track buffers) must find one among the free slots and, with the Mamba radix cache,
  the cached states it could evict, else OutOfMemoryError with nothing changed.
- :meth:`after_admission`, once the rows are taken: zero the fresh slots (SGLang's deferred clear
  runs in the same forward).
- :meth:`after_write`, whenever tokens' KV is computed: the forward also advanced the request's
  state, whose tag becomes that of every token computed so far.
- :meth:`before_release`, when a request's row goes back (finish, abort, retract, also inside
  prefill): its Mamba slot and track buffers go back too (SGLang frees them in
  ``release_kv_cache`` when the prefix cache does not manage Mamba states).

With the radix cache on, the tree is a
:class:`~kvpool.reference.mamba.radix_release.MambaLifecycleCache` (``tree``) and the hooks add
SGLang's Mamba steps around it: :meth:`match` (a prefix match with copy-on-write of the matched
state into the request's own slot; the copy is made at once, the checkpoint being locked and
never written), :meth:`stage_cow` (the same for a request matched by ``extend`` itself, after
its checks), :meth:`evict_for_admission` (``alloc_req_slots``: evict cached states down to a
headroom of ``MAMBA_STATE_PER_REQ_PREFIX_CACHE`` per request) and :meth:`release_waiting` (an
aborted or refused waiting request returns its copy-on-write slot). A finished request's state
goes to the tree or back through the tree's ``cache_finished_req``.

Under SGLang 0.5.23's rules (``Rules.mamba_tree == "unified"``, ``release_path ==
"checkpoint"``) the tree is
:class:`~kvpool.reference.unified.mamba_release.UnifiedMambaLifecycleCache` and admission
follows 0.5.23's ``ensure_mamba_capacity``: :meth:`reclaim_before_alloc` evicts exactly the
shortfall of the slots the batch needs, before any KV is allocated (and
:meth:`evict_for_admission` does nothing). Under 0.5.16's (``"unified"`` with
``"finished_req"``) the tree is the same with 0.5.16's release
(:class:`~kvpool.reference.unified.mamba_release.UnifiedMambaLifecycleCacheV0516`) and admission
is 0.5.16's headroom (:meth:`evict_for_admission`), as with the legacy tree.

Scope: with the Mamba radix cache, kvpool models SGLang's strategy without track buffers (page
size 1, LRU eviction, SGLang 0.5.16's or 0.5.23's release path with its tree) and no sessions
(``open_session`` raises ConfigError); other hybrid configurations with the radix cache on are
ConfigError. With the
radix cache off, a session keeps its last turn's Mamba slot and track buffers between turns
with its row (:class:`~kvpool.reference.lifecycle.session.SessionSlot`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from kvpool.config import PoolConfig
from kvpool.errors import (
    ConfigError,
    InvalidArgumentError,
    OutOfMemoryError,
    RequestStateError,
)
from kvpool.host_checks import as_count, as_instance, as_int, instance_list
from kvpool.records import fast_record
from kvpool.reference.lifecycle.session import SessionSlot
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.reference.mamba.lifecycle import (
    admission_headroom,
    forward_state,
    prepare_forward,
    release_waiting,
)
from kvpool.reference.mamba.radix_cache import MambaMatchResult
from kvpool.reference.mamba.radix_release import MambaLifecycleCache
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix_key import RadixKey
from kvpool.reference.req import Req
from kvpool.reference.unified.mamba_release import (
    UnifiedMambaLifecycleCache,
    UnifiedMambaLifecycleCacheV0516,
)
from kvpool.snapshot import HybridStateSnapshot, MambaReqSnapshot, MambaTreeSnapshot
from kvpool.tags import mamba_state_tag

MAMBA_TREE_RELEASE = {
    "mamba_radix": ("finished_req",),
    "unified": ("checkpoint", "finished_req"),
}
"""The release paths (``Rules.release_path``) each Mamba tree (``Rules.mamba_tree``) is
modelled with: the legacy tree with SGLang 0.5.16's; the unified tree with 0.5.23's and with
0.5.16's (the tree 0.5.16's registry builds, :class:`~kvpool.reference.unified.mamba_release.
UnifiedMambaLifecycleCacheV0516`)."""


def check_hybrid_config(config: PoolConfig) -> None:
    """ConfigError for a hybrid configuration the lifecycle does not model: with the radix
    cache on, track buffers, a page size above 1, an eviction policy other than LRU, or a
    release path other than one of the rules' Mamba tree (:data:`MAMBA_TREE_RELEASE`)."""
    if config.mamba_slots is None or config.disable_radix_cache:
        return
    if config.mamba_track_buffers or config.page_size != 1:
        raise ConfigError("the Mamba radix cache is modelled without track buffers, page size 1")
    rules = config.rules
    paired = rules.release_path in MAMBA_TREE_RELEASE[rules.mamba_tree]
    if config.eviction_policy != "lru" or not paired:
        raise ConfigError(
            "the Mamba radix cache evicts LRU and releases as SGLang 0.5.16 (mamba_radix or "
            "unified, finished_req) or 0.5.23 (unified, checkpoint)"
        )


def mamba_lifecycle_tree(
    config: PoolConfig, pool: ReqToTokenPool, alloc: BaseTokenToKVPoolAllocator
) -> MambaLifecycleCache:
    """The prefix cache of a hybrid configuration with the radix cache on: SGLang 0.5.16's
    Mamba radix cache or, under ``Rules.mamba_tree == "unified"``, the unified tree with
    0.5.23's release (``release_path == "checkpoint"``) or 0.5.16's (``"finished_req"``)."""
    # a hybrid configuration's table is the hybrid pool (hybrid_pool) or an injected one that
    # offers its calls; the manager types its table as the plain one
    hybrid = cast(HybridReqToTokenPool, pool)
    if config.rules.mamba_tree == "unified" and config.rules.release_path == "finished_req":
        return UnifiedMambaLifecycleCacheV0516(hybrid, alloc, config.page_size, rules=config.rules)
    if config.rules.mamba_tree == "unified":
        return UnifiedMambaLifecycleCache(hybrid, alloc, config.page_size, rules=config.rules)
    return MambaLifecycleCache(hybrid, alloc, config.page_size)


def hybrid_pool(config: PoolConfig) -> HybridReqToTokenPool:
    """The request table of a hybrid configuration."""
    assert config.mamba_slots is not None
    return HybridReqToTokenPool(config.req_pool_size, config.max_context_len, config.mamba_slots,
                                config.mamba_layers, config.mamba_track_buffers,
                                rules=config.rules)  # fmt: skip


def mamba_hooks_for(pool: object) -> MambaHooks | None:
    """Hooks over ``pool`` when it is a hybrid pool, else None."""
    return MambaHooks(pool) if isinstance(pool, HybridReqToTokenPool) else None


class MambaHooks:
    """The Mamba work of the lifecycle over ``pool`` (see the module docstring)."""

    def __init__(self, pool: HybridReqToTokenPool) -> None:
        self.pool = pool
        self.tree: MambaLifecycleCache | None = None
        """The Mamba radix cache when the radix cache is on (set by the lifecycle)."""

    @property
    def unified(self) -> bool:
        """Whether admission is SGLang 0.5.23's (its unified FULL+MAMBA tree with its release:
        the exact shortfall, :meth:`reclaim_before_alloc`); 0.5.16's unified tree admits with
        the legacy tree's headroom (:meth:`evict_for_admission`)."""
        return isinstance(self.tree, UnifiedMambaLifecycleCache) and self.tree.exact_reclaim

    @property
    def slots_before_kv(self) -> bool:
        """Whether admission takes the rows and Mamba slots (after evicting states to the
        headroom) before the batch's KV: SGLang 0.5.16's ``alloc_for_extend`` runs
        ``alloc_req_slots`` first, which shows with its unified tree (the KV's eviction frees
        states too); the legacy tree keeps kvpool's order (KV first)."""
        return isinstance(self.tree, UnifiedMambaLifecycleCacheV0516)

    @staticmethod
    def _waiting(name: str, req: object) -> Req:
        """``req`` as a request holding no row (waiting): InvalidArgumentError for another
        type, RequestStateError for a request that holds a row."""
        out = as_instance(name, req, Req)
        if out.req_pool_idx is not None:
            raise RequestStateError(f"{name}: request {out.rid!r} holds a row (not waiting)")
        return out

    @staticmethod
    def _check_stop(req: Req, stop: object) -> int:
        """``stop`` (tokens) as an int with ``kv_committed_len <= stop <= min(kv_allocated_len,
        len(tokens))``: the forward computes tokens inside the allocation, from the committed
        ones on (InvalidArgumentError otherwise)."""
        out = as_int("stop", stop)
        limit = min(req.kv_allocated_len, req.seq_len())
        if not req.kv_committed_len <= out <= limit:
            raise InvalidArgumentError(
                f"stop must lie in [{req.kv_committed_len}, {limit}] for request {req.rid!r}, "
                f"got {stop!r}"
            )
        return out

    def check_admission(self, reqs: Sequence[Req], chunks: int = 0) -> None:
        """OutOfMemoryError (nothing changed) when the batch needs more Mamba slots than are
        free (plus, with the Mamba radix cache, its evictable states). ``chunks``: requests of
        the batch that stay between prefill chunks, each needing one more slot for the tree's
        copy of its state (counted with the Mamba radix cache only)."""
        reqs = instance_list("reqs", reqs, Req)
        chunks = as_count("chunks", chunks)
        need = self.pool.mamba_slots_needed(reqs)
        free = self.pool.mamba_allocator.schedulable_available_size()
        evictable = 0
        if self.tree is not None:
            need += chunks
            evictable = self.tree.mamba_evictable_size()
        if need > free + evictable:
            raise OutOfMemoryError(f"need {need} Mamba slots; {free} free, {evictable} cached")

    def match(self, key: RadixKey, req: Req) -> MambaMatchResult:
        """The Mamba radix cache's prefix match with copy-on-write (the copy made at once).
        InvalidArgumentError for a key that is not a :class:`RadixKey` or a ``req`` that is not
        a request, RequestStateError for a request holding a row, ConfigError without the
        Mamba radix cache; nothing changed."""
        key = as_instance("key", key, RadixKey)
        req = self._waiting("req", req)
        if self.tree is None:  # the chunk cache has no states to match
            raise ConfigError("match needs the Mamba radix cache (radix cache on)")
        result = self.tree.match_prefix(key, req, cow_mamba=True)
        if result.cow_staged:
            prepare_forward(self.pool, [req])
        return result

    def stage_cow(self, reqs: Sequence[Req]) -> None:
        """Copy-on-write for waiting requests holding no slot whose matched node has a state
        (matched without one): a slot each (evicting a state when none is free; admission
        counted it), then the copy."""
        reqs = instance_list("reqs", reqs, Req)
        if self.tree is None:
            return
        for req in reqs:
            node = req.last_node
            if req.mamba_pool_idx is not None or node is None:
                continue
            src = getattr(node, "mamba_value", None)
            if src is None:
                continue
            req.mamba_pool_idx = self.tree.alloc_mamba_slot()
            req.mamba_cow_src_index = src
            req.mamba_needs_clear = False
            prepare_forward(self.pool, [req])

    def evict_for_admission(self, reqs: Sequence[Req]) -> None:
        """SGLang's ``alloc_req_slots`` with a Mamba prefix cache: when fewer slots are
        schedulable than the headroom (or than the batch needs), evict the difference in cached
        states first. Nothing under 0.5.23's rules (:meth:`reclaim_before_alloc` did it)."""
        reqs = instance_list("reqs", reqs, Req)
        if self.tree is None or self.unified:
            return
        free = self.pool.mamba_allocator.schedulable_available_size()
        want = max(admission_headroom(len(reqs), True), self.pool.mamba_slots_needed(reqs))
        if free < want:
            self.tree.evict_mamba(want - free)

    def reclaim_before_alloc(self, reqs: Sequence[Req]) -> None:
        """SGLang 0.5.23's ``ensure_mamba_capacity`` (unified tree only), before the batch's KV
        is allocated: when fewer slots are schedulable than the batch needs, evict exactly the
        shortfall in cached states (admission checked it can be had)."""
        reqs = instance_list("reqs", reqs, Req)
        if self.tree is None or not self.unified:
            return
        need = self.pool.mamba_slots_needed(reqs)
        free = self.pool.mamba_allocator.schedulable_available_size()
        if free < need:
            self.tree.evict_mamba(need - free)

    def release_waiting(self, req: Req) -> None:
        """A waiting request leaves (abort, or a refused admission that matched it): its
        copy-on-write slot, if any, goes back."""
        req = self._waiting("req", req)
        if req.mamba_pool_idx is not None:
            release_waiting(self.pool, req)

    def after_admission(self, reqs: Sequence[Req]) -> None:
        """Zero the state of every request given a fresh slot."""
        reqs = instance_list("reqs", reqs, Req)
        prepare_forward(self.pool, reqs)

    def after_write(self, req: Req, stop: int) -> None:
        """The forward computed tokens up to ``stop``: the state is that of ``tokens[:stop]``."""
        stop = self._check_stop(as_instance("req", req, Req), stop)
        forward_state(self.pool, [req], [mamba_state_tag(req.all_token_ids[:stop], req.extra_key)])

    def before_release(self, req: Req) -> None:
        """Give back the request's Mamba slot and track buffers (it holds them with its row)."""
        req = as_instance("req", req, Req)
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        if req.mamba_pool_idx is not None:
            self.pool.free_mamba_cache(req)

    def snapshot(
        self,
        reqs: Iterable[Req],
        sessions: Iterable[SessionSlot] = (),
        tree: MambaTreeSnapshot | None = None,
    ) -> HybridStateSnapshot:
        """The hybrid pool and every live request's Mamba slots with the state they must hold:
        that of every token whose KV is computed (``kv_committed_len``; a waiting request's
        copy-on-write slot: its matched prefix); then every session holding a slot between
        turns (``session ID``: the state after its committed tokens); then ``tree``, the Mamba
        radix cache's snapshot (its checkpoints are the tree's slots)."""
        reqs = instance_list("reqs", reqs, Req)
        sessions = instance_list("sessions", sessions, SessionSlot)
        if tree is not None:
            as_instance("tree", tree, MambaTreeSnapshot)
        views = tuple(
            _MAMBA_REQ(
                rid=r.rid,
                row=r.req_pool_idx,
                slot=r.mamba_pool_idx,
                track=tuple(r.mamba_ping_pong_track_buffer or ()),
                expected_tag=(
                    None
                    if r.mamba_pool_idx is None
                    or r.mamba_needs_clear
                    or r.mamba_cow_src_index is not None
                    else mamba_state_tag(r.all_token_ids[: _state_len(r)], r.extra_key)
                ),
            )
            for r in reqs
            if r.req_pool_idx is not None or r.mamba_pool_idx is not None
        )
        held = tuple(
            _MAMBA_REQ(
                rid=f"session {s.session_id}",
                row=s.req_pool_idx,
                slot=s.mamba_pool_idx,
                track=tuple(s.mamba_ping_pong_track_buffer or ()),
                expected_tag=mamba_state_tag(s.tokens, s.extra_key),
            )
            for s in sessions
            if s.mamba_pool_idx is not None
        )
        return HybridStateSnapshot(self.pool.hybrid_snapshot(), views + held, tree)


def _state_len(req: Req) -> int:
    """Tokens whose state the request's slot holds: those computed, or (waiting, after a
    copy-on-write) those of its matched prefix."""
    return req.kv_committed_len if req.req_pool_idx is not None else len(req.prefix_indices)


_MAMBA_REQ = fast_record(MambaReqSnapshot)
"""Builds a :class:`MambaReqSnapshot` (every field by keyword: :func:`fast_record`)."""


__all__ = [
    "MAMBA_TREE_RELEASE",
    "MambaHooks",
    "check_hybrid_config",
    "hybrid_pool",
    "mamba_hooks_for",
    "mamba_lifecycle_tree",
]

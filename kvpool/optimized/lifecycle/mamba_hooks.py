"""The lifecycle's Mamba hooks (optimized twin): what a hybrid model adds to every path.

Same hooks, call points, results and errors as :mod:`kvpool.reference.lifecycle.mamba_hooks` (read
its docstring). The state tag of a forward is the request's cached running KV tag of its last
computed token (equal to :func:`kvpool.tags.mamba_state_tag` of the tokens so far), and the device
work goes through the twin's batched Mamba steps.
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
from kvpool.optimized.index_args import host_ints
from kvpool.optimized.lifecycle.session import SessionSlot
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.optimized.mamba.lifecycle import forward_state, prepare_forward, release_waiting
from kvpool.optimized.mamba.radix_cache import MambaMatchResult
from kvpool.optimized.mamba.radix_release import MambaLifecycleCache
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.optimized.radix_key import RadixKey
from kvpool.optimized.req import Req
from kvpool.optimized.unified.mamba_release import (
    UnifiedMambaLifecycleCache,
    UnifiedMambaLifecycleCacheV0516,
)
from kvpool.records import filled_record
from kvpool.reference.mamba.lifecycle import admission_headroom
from kvpool.snapshot import HybridStateSnapshot, MambaReqSnapshot, MambaTreeSnapshot
from kvpool.tags import mamba_state_tag


def hybrid_pool(config: PoolConfig, options: TwinOptions | None = None) -> HybridReqToTokenPool:
    """The request table of a hybrid configuration."""
    assert config.mamba_slots is not None
    return HybridReqToTokenPool(config.req_pool_size, config.max_context_len, config.mamba_slots,
                                config.mamba_layers, config.mamba_track_buffers,
                                rules=config.rules, options=options)  # fmt: skip


def mamba_lifecycle_tree(
    config: PoolConfig,
    pool: ReqToTokenPool,
    alloc: BaseTokenToKVPoolAllocator,
    options: TwinOptions | None = None,
) -> MambaLifecycleCache:
    """The prefix cache of a hybrid configuration with the radix cache on: SGLang 0.5.16's
    Mamba radix cache or, under ``Rules.mamba_tree == "unified"``, the unified tree with
    0.5.23's release or 0.5.16's (``release_path == "finished_req"``)."""
    # a hybrid configuration's table is the hybrid pool (hybrid_pool) or an injected one that
    # offers its calls; the manager types its table as the plain one
    hybrid = cast(HybridReqToTokenPool, pool)
    if config.rules.mamba_tree == "unified" and config.rules.release_path == "finished_req":
        return UnifiedMambaLifecycleCacheV0516(hybrid, alloc, config.page_size,
                                               rules=config.rules, options=options)  # fmt: skip
    if config.rules.mamba_tree == "unified":
        return UnifiedMambaLifecycleCache(hybrid, alloc, config.page_size, rules=config.rules,
                                          options=options)  # fmt: skip
    return MambaLifecycleCache(hybrid, alloc, config.page_size, options=options)


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
        is allocated: evict exactly the shortfall of the slots the batch needs."""
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
        tag = int(req.kv_tags_upto(stop)[stop - 1]) if stop > 0 else 0
        forward_state(self.pool, [req], [tag])

    def after_writes(self, reqs: Sequence[Req], stops: Sequence[int]) -> None:
        """:meth:`after_write` for a batch: one state write for every request."""
        reqs = instance_list("reqs", reqs, Req)
        stops = host_ints("stops", stops)
        if len(stops) != len(reqs):
            raise InvalidArgumentError(f"{len(stops)} stops for {len(reqs)} requests")
        for r, s in zip(reqs, stops, strict=True):
            self._check_stop(r, s)
        if not reqs:
            return
        tags = [
            int(r.kv_tags_upto(s)[s - 1]) if s > 0 else 0 for r, s in zip(reqs, stops, strict=True)
        ]
        forward_state(self.pool, list(reqs), tags)

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
        return self._snapshot_of(reqs, sessions, tree)

    def _snapshot_of(
        self,
        reqs: Sequence[Req],
        sessions: Iterable[SessionSlot],
        tree: MambaTreeSnapshot | None,
    ) -> HybridStateSnapshot:
        """:meth:`snapshot` of arguments of the right types (a memory manager's own requests
        and sessions), without their checks."""
        views: list[MambaReqSnapshot] = []
        for r in reqs:
            slot = r.mamba_pool_idx
            if r.req_pool_idx is None and slot is None:
                continue
            views.append(
                filled_record(
                    MambaReqSnapshot,
                    {
                        "rid": r.rid,
                        "row": r.req_pool_idx,
                        "slot": slot,
                        "track": tuple(r.mamba_ping_pong_track_buffer or ()),
                        "expected_tag": (
                            None
                            if slot is None
                            or r.mamba_needs_clear
                            or r.mamba_cow_src_index is not None
                            else _expected_state_tag(r)
                        ),
                    },
                )
            )
        for s in sessions:
            if s.mamba_pool_idx is None:
                continue
            views.append(
                filled_record(
                    MambaReqSnapshot,
                    {
                        "rid": f"session {s.session_id}",
                        "row": s.req_pool_idx,
                        "slot": s.mamba_pool_idx,
                        "track": tuple(s.mamba_ping_pong_track_buffer or ()),
                        "expected_tag": mamba_state_tag(s.tokens, s.extra_key),
                    },
                )
            )
        return filled_record(
            HybridStateSnapshot,
            {"pool": self.pool.hybrid_snapshot(), "reqs": tuple(views), "tree": tree},
        )


def _expected_state_tag(req: Req) -> int:
    """``mamba_state_tag(all_token_ids[:n], extra_key)`` for ``n = _state_len(req)``: the last of
    the request's cached running KV tags (:meth:`Req.kv_tags_upto`, equal by contract; no
    rehash of the whole history) for a count within its tokens."""
    n = _state_len(req)
    if not 0 < n <= req.seq_len():
        return mamba_state_tag(req.all_token_ids[:n], req.extra_key)
    return int(req.kv_tags_upto(n)[n - 1])


def _state_len(req: Req) -> int:
    """Tokens whose state the request's slot holds: those computed, or (waiting, after a
    copy-on-write) those of its matched prefix."""
    return req.kv_committed_len if req.req_pool_idx is not None else len(req.prefix_indices)


__all__ = [
    "MambaHooks",
    "hybrid_pool",
    "mamba_hooks_for",
    "mamba_lifecycle_tree",
]

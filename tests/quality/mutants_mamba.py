"""Seeded Mamba bugs (the field bugs of hybrid models): :data:`MAMBA_MUTANTS` and
:data:`MAMBA_LIFECYCLE_MUTANTS`.

Each :class:`~kvpool.testing.quality.ImplementationMutant` turns the unchecked torch twin's
:class:`~kvpool.testing.bundle.Implementation` into a buggy one (a patched step of
:mod:`kvpool.optimized.mamba.lifecycle`, or a patched pool method on each pool built) and names
the detectors that must catch it; :func:`kvpool.testing.quality.hunt_implementation` hunts it
with the component machine. The lifecycle form is a manager patch
(:class:`~kvpool.testing.quality.Mutant`) hunted by :func:`kvpool.testing.quality.hunt`.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch

from kvpool.testing.bundle import Implementation
from kvpool.testing.quality import ImplementationMutant, Mutant, need


def _with_step(
    impl: Implementation, name: str, make: Callable[[Any], Callable[..., Any]]
) -> Implementation:
    """``impl`` whose Mamba step ``name`` is ``make(original)`` (the module is left alone)."""
    need(impl.mamba_steps, name)
    steps = types.SimpleNamespace(**{k: getattr(impl.mamba_steps, k) for k in dir(impl.mamba_steps)
                                     if not k.startswith("__")})  # fmt: skip
    setattr(steps, name, make(getattr(impl.mamba_steps, name)))
    return dataclasses.replace(impl, mamba_steps=steps)


def waiting_abort_leaks(impl: Implementation) -> Implementation:
    """An aborted or rejected waiting request that already held a Mamba slot is dropped without
    freeing it."""

    def make(_orig: Any) -> Callable[..., Any]:
        def release_waiting(pool: Any, req: Any) -> list[int]:
            req.mamba_pool_idx = None  # dropped, never given back
            req.mamba_cow_src_index = None
            req.mamba_needs_clear = False
            return []

        return release_waiting

    return _with_step(impl, "release_waiting", make)


def prefill_finish_keeps_slot(impl: Implementation) -> Implementation:
    """A request finishing (or aborted) inside chunked prefill frees its row but keeps its
    Mamba slot."""

    def make(orig: Any) -> Callable[..., Any]:
        def release_running(
            pool: Any, req: Any, keep: int | None = None, donate: bool = False
        ) -> Any:
            if req.is_chunked > 0 and not donate:
                pool.free(req)
                return []
            return orig(pool, req, keep, donate)

        return release_running

    return _with_step(impl, "release_running", make)


def admit_asserts(impl: Implementation) -> Implementation:
    """Admission that does not count Mamba slots: the pool takes the rows, then asserts when the
    Mamba slots run out (SGLang's order before its admission check existed)."""
    assert impl.hybrid_req_to_token_pool is not None
    build = impl.hybrid_req_to_token_pool

    def make_pool(config: Any) -> Any:
        pool = build(config)
        need(pool, "alloc", "mamba_allocator")
        table_alloc = super(type(pool), pool).alloc

        def alloc(reqs: Any) -> Any:
            rows = table_alloc(reqs)
            if rows is None:
                return None
            for req in reqs:
                if req.mamba_pool_idx is None:
                    got = pool.mamba_allocator.alloc(1)
                    assert got is not None, "Not enough space for mamba cache"
                    req.mamba_pool_idx, req.mamba_needs_clear = got[0], True
                if pool.track_buffers and req.mamba_ping_pong_track_buffer is None:
                    track = pool.mamba_allocator.alloc(pool.track_buffers)
                    assert track is not None, "Not enough space for mamba ping pong idx"
                    req.mamba_ping_pong_track_buffer, req.mamba_next_track_idx = track, 0
            index = torch.tensor(rows, dtype=torch.int64)
            slots = torch.tensor([r.mamba_pool_idx for r in reqs], dtype=torch.int32)
            pool.req_index_to_mamba_index_mapping[index] = slots
            if pool.track_buffers:
                tracks = torch.tensor([r.mamba_ping_pong_track_buffer for r in reqs])
                pool.req_index_to_mamba_ping_pong_track_buffer_mapping[index] = tracks
            return rows

        pool.alloc = alloc
        return pool

    def make(_orig: Any) -> Callable[..., Any]:
        def admit(pool: Any, reqs: Any, evict_mamba: Any = None) -> Any:
            return pool.alloc(reqs)  # no headroom check, no eviction

        return admit

    return _with_step(dataclasses.replace(impl, hybrid_req_to_token_pool=make_pool), "admit", make)


def cow_shares_checkpoint(impl: Implementation) -> Implementation:
    """A prefix match hands the cached state's own slot to the request instead of a copy: the
    checkpoint is shared by the tree and the request, whose forward overwrites it in place."""

    def make(_orig: Any) -> Callable[..., Any]:
        def stage_cow(pool: Any, req: Any, src_slot: int) -> bool:
            if req.mamba_pool_idx is not None:
                pool.mamba_allocator.free([req.mamba_pool_idx])
            req.mamba_pool_idx = src_slot
            req.mamba_cow_src_index = None
            req.mamba_needs_clear = False
            return True

        return stage_cow

    return _with_step(impl, "stage_cow", make)


def alloc_skips_group(impl: Implementation) -> Implementation:
    """The pool takes a batch's Mamba slots in one call from the free list even inside an open
    alloc group, where SGLang's per-request single-slot calls take the group's prefetched slots
    (kvpool's own bug, found against SGLang 0.5.16)."""
    assert impl.hybrid_req_to_token_pool is not None
    build = impl.hybrid_req_to_token_pool

    def make_pool(config: Any) -> Any:
        pool = build(config)
        need(pool, "alloc", "mamba_allocator")
        need(pool.mamba_allocator, "_group")
        original = pool.alloc

        def alloc(reqs: Any) -> Any:
            group, pool.mamba_allocator._group = pool.mamba_allocator._group, None
            try:
                return original(reqs)
            finally:
                pool.mamba_allocator._group = group

        pool.alloc = alloc
        return pool

    return dataclasses.replace(impl, hybrid_req_to_token_pool=make_pool)


def _with_tree(impl: Implementation, patch: Callable[[Any], None]) -> Implementation:
    """``impl`` whose every Mamba radix cache is patched in place after it is built."""
    assert impl.mamba_radix_cache is not None
    build = impl.mamba_radix_cache

    def make(config: Any, pool: Any, alloc: Any) -> Any:
        tree = build(config, pool, alloc)
        patch(tree)
        return tree

    return dataclasses.replace(impl, mamba_radix_cache=make)


def evict_ignores_state_lock(impl: Implementation) -> Implementation:
    """State eviction takes the state a running request still has to copy (its lock ignored)."""

    def patch(tree: Any) -> None:
        need(tree.mamba_lru_list, "_locked")
        tree.mamba_lru_list._locked = lambda node: False

    return _with_tree(impl, patch)


def tombstone_leaf_kept(impl: Implementation) -> Implementation:
    """Evicting a leaf leaves its childless tombstone parents in the tree (their KV leaks into
    nodes no state can ever be matched from)."""

    def patch(tree: Any) -> None:
        need(tree, "_evict_leaf", "_detach")

        def evict_leaf(leaf: Any) -> tuple[int, int]:
            tree.token_to_kv_pool_allocator.free(leaf.value)
            tree.req_to_token_pool.mamba_allocator.free([leaf.mamba_value])
            tree.full_lru_list.remove(leaf)
            tree.mamba_lru_list.remove(leaf)
            tree._detach(leaf)
            tree.mamba_evictable_size_ -= 1
            return len(leaf.value), 1

        tree._evict_leaf = evict_leaf

    return _with_tree(impl, patch)


MAMBA_MUTANTS: tuple[ImplementationMutant, ...] = (
    ImplementationMutant("mamba-waiting-abort-leaks",
                         "Mamba slot of an aborted waiting request leaked",
                         ("INV-MAMBA-ACCOUNTING",), waiting_abort_leaks),
    ImplementationMutant("mamba-prefill-finish-keeps",
                         "request finishing inside prefill keeps its slot",
                         ("INV-MAMBA-ACCOUNTING",), prefill_finish_keeps_slot),
    ImplementationMutant("mamba-admit-asserts",
                         "admission with too few Mamba slots, then an assert",
                         ("crash", "unchanged-on-error"), admit_asserts),
    ImplementationMutant("mamba-cow-shares-checkpoint",
                         "cached state shared and overwritten in place",
                         ("INV-MAMBA-ONE-OWNER", "INV-MAMBA-CHECKPOINT", "lockstep-diff"),
                         cow_shares_checkpoint),
    ImplementationMutant("mamba-evict-locked-state",
                         "eviction of a state a request still copies",
                         ("INV-MAMBA-ONE-OWNER", "INV-MAMBA-ACCOUNTING", "lockstep-diff"),
                         evict_ignores_state_lock, "mamba_radix_cache"),
    ImplementationMutant("mamba-tombstone-leaf-kept",
                         "tombstone parents left behind as leaves",
                         ("INV-MAMBA-TREE-SHAPE",), tombstone_leaf_kept, "mamba_radix_cache"),
    ImplementationMutant("mamba-alloc-skips-group",
                         "batch slots taken past an open alloc group",
                         ("lockstep-diff", "INV-MAMBA-ONE-OWNER", "INV-ROW-ACCOUNTING"),
                         alloc_skips_group),
)  # fmt: skip
"""The Mamba field bugs of the quality suite."""


def lifecycle_prefill_release_keeps_slot(mm: Any) -> None:
    """Lifecycle form of the prefill field bug (a manager patch, see
    :class:`~kvpool.testing.quality.Mutant`): a request released between prefill chunks (aborted
    or retracted) keeps its Mamba slot."""
    hooks = mm.mamba_hooks
    need(hooks, "before_release")
    original = hooks.before_release

    def before_release(req: Any) -> None:
        if not req.is_chunked:
            original(req)

    hooks.before_release = before_release


def lifecycle_session_close_leaks_state(mm: Any) -> None:
    """A hybrid session closed frees its row and KV but not the Mamba slot and track buffers
    its last turn left with it."""
    need(mm, "close_session", "sessions")
    original = mm.close_session

    def close_session(session_id: str) -> None:
        session = mm.sessions.get(session_id)
        if session is not None and session.busy_with is None:
            session.mamba_pool_idx = None  # forgotten, never given back
            session.mamba_ping_pong_track_buffer = None
        original(session_id)

    mm.close_session = close_session


HYBRID_LIFECYCLE = {"disable_radix_cache": True, "mamba_slots": 3, "mamba_track_buffers": 1}
"""Config overrides of the lifecycle hunts of Mamba bugs: a hybrid model, few slots."""

MAMBA_RADIX_LIFECYCLE = {"disable_radix_cache": False, "mamba_slots": 3,
                         "mamba_track_buffers": 0, "eviction_policy": "lru"}  # fmt: skip
"""Config overrides of the lifecycle hunts with the Mamba radix cache (page size 1)."""


def lifecycle_cow_hands_checkpoint(mm: Any) -> None:
    """A prefix match's copy-on-write hands the request the tree's checkpoint slot itself (no
    copy): the request's forward then writes the cached state in place."""
    hooks = mm.mamba_hooks
    need(hooks, "match", "tree")

    def match(key: Any, req: Any) -> Any:
        result = hooks.tree.match_prefix(key)
        cached = result.last_device_node.mamba_value
        if cached is not None and req.mamba_pool_idx is None:
            req.mamba_pool_idx = cached  # shared with the tree
            req.mamba_needs_clear = False
        return result

    hooks.match = match


def lifecycle_running_abort_drops_slot(mm: Any) -> None:
    """An aborted running request's Mamba slot is dropped (forgotten) instead of freed."""
    pool = mm.req_to_token_pool
    need(pool, "free_mamba_cache")
    need(mm, "abort", "reqs")
    original_abort, original_free = mm.abort, pool.free_mamba_cache
    dropping = [False]

    def free_mamba_cache(req: Any, *args: Any) -> None:
        if not dropping[0]:
            original_free(req, *args)
            return
        req.mamba_pool_idx = None  # never given back
        req.mamba_cow_src_index = None
        req.mamba_needs_clear = False

    def abort(rid: str) -> None:
        req = mm.reqs.get(rid)
        dropping[0] = req is not None and req.state == "running"
        try:
            original_abort(rid)
        finally:
            dropping[0] = False

    pool.free_mamba_cache = free_mamba_cache
    mm.abort = abort


MAMBA_LIFECYCLE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("mamba-chunked-release-keeps", "a request released inside prefill keeps its slot",
           ("INV-MAMBA-ACCOUNTING",), lifecycle_prefill_release_keeps_slot, (1, 2),
           HYBRID_LIFECYCLE, ("new_req", "extend", "extend", "abort", "retract")),
    Mutant("mamba-session-close-leaks", "a closed session keeps its Mamba slot",
           ("INV-MAMBA-ACCOUNTING",), lifecycle_session_close_leaks_state, (1, 2),
           HYBRID_LIFECYCLE, ("open_session", "session_turn", "extend", "finish",
                              "close_session")),
    Mutant("mamba-radix-cow-hands-checkpoint", "a match hands over the tree's checkpoint slot",
           ("INV-MAMBA-ONE-OWNER", "INV-MAMBA-CHECKPOINT"), lifecycle_cow_hands_checkpoint,
           (1,), MAMBA_RADIX_LIFECYCLE, ("twin_req", "new_req", "match_prefix", "extend",
                                         "decode", "finish")),
    Mutant("mamba-radix-running-abort-drops", "an aborted running request's slot dropped",
           ("INV-MAMBA-ACCOUNTING",), lifecycle_running_abort_drops_slot, (1,),
           MAMBA_RADIX_LIFECYCLE, ("new_req", "extend", "decode", "abort")),
)  # fmt: skip
"""Mamba bugs hunted by the lifecycle machine (:func:`kvpool.testing.quality.hunt`)."""


__all__ = [
    "HYBRID_LIFECYCLE",
    "MAMBA_LIFECYCLE_MUTANTS",
    "MAMBA_MUTANTS",
    "MAMBA_RADIX_LIFECYCLE",
    "lifecycle_cow_hands_checkpoint",
    "lifecycle_prefill_release_keeps_slot",
    "lifecycle_running_abort_drops_slot",
    "lifecycle_session_close_leaks_state",
]

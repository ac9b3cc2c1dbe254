"""Seeded lifecycle bugs: finish and release paths, request rows, sessions.

Each function patches one optimized twin in place (see :mod:`kvpool.testing.quality.mutant`);
:mod:`tests.quality.mutants` registers them with the detectors that must catch them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvpool.constants import ceil_align, floor_align
from kvpool.testing.quality import during, wrap


def finish_frees_twice(mm: Any) -> None:
    def make(orig: Any) -> Callable[..., None]:
        def release(req: Any, is_insert: bool = True) -> None:
            row, start, stop = req.req_pool_idx, req.cache_protected_len, req.kv_committed_len
            slots = mm.req_to_token_pool.read(row, start, stop).clone()
            orig(req, is_insert)
            if not is_insert and slots.numel():
                mm.token_to_kv_pool_allocator.free(slots)  # the non-insert path frees again

        return release

    wrap(mm, "release_kv_cache", make)


def leak_partial_tail(mm: Any) -> None:
    tree, alloc = mm.tree_cache, mm.token_to_kv_pool_allocator
    ps = mm.page_size

    def make(orig: Any) -> Callable[..., None]:
        def cache_finished(req: Any, is_insert: bool = True, row_read: Any = None) -> None:
            committed = req.kv_committed_len
            aligned = floor_align(committed, ps)
            if not is_insert or aligned == committed:
                return orig(req, is_insert, row_read)  # type: ignore[no-any-return]
            tail = set(mm.req_to_token_pool.read(req.req_pool_idx, aligned, committed).tolist())
            free = alloc.free

            def free_but_tail(slots: Any) -> None:
                kept = [s for s in torch.as_tensor(slots).tolist() if s not in tail]
                free(torch.tensor(kept, dtype=torch.int64))

            return during(alloc, "free", free_but_tail, lambda: orig(req, is_insert, row_read))  # type: ignore[no-any-return]

        return cache_finished

    wrap(tree, "cache_finished_req", make)


def leak_spec_overalloc(mm: Any) -> None:
    def make(orig: Any) -> Callable[..., None]:
        def release(req: Any, is_insert: bool = True) -> None:
            # forgets the speculative columns: they are never freed
            req.kv_allocated_len = min(
                req.kv_allocated_len, ceil_align(req.kv_committed_len, mm.page_size)
            )
            orig(req, is_insert)

        return release

    wrap(mm, "release_kv_cache", make)


def chunked_row_reused(mm: Any) -> None:
    pool = mm.req_to_token_pool

    def make(orig: Any) -> Callable[..., list[int] | None]:
        def alloc(reqs: Any) -> list[int] | None:
            fresh = [i for i, r in enumerate(reqs) if r.req_pool_idx is None]
            rows = orig(reqs)
            busy = [
                r.req_pool_idx
                for r in mm.reqs.values()
                if r.is_chunked and r.req_pool_idx is not None and r not in reqs
            ]
            if rows is not None and fresh and busy:
                i = fresh[0]
                pool.free_slots.append(rows[i])  # the fresh row goes back...
                rows[i] = reqs[i].req_pool_idx = busy[0]  # ...and the chunked one is shared
            return rows  # type: ignore[no-any-return]

        return alloc

    wrap(pool, "alloc", make)


def generation_not_bumped(mm: Any) -> None:
    pool = mm.req_to_token_pool

    def make(orig: Any) -> Callable[..., list[int] | None]:
        def alloc(reqs: Any) -> list[int] | None:
            saved = list(pool.req_generation)
            rows = orig(reqs)
            pool.req_generation[:] = saved
            return rows  # type: ignore[no-any-return]

        return alloc

    wrap(pool, "alloc", make)


def row_not_rewritten(mm: Any) -> None:
    tree, pool = mm.tree_cache, mm.req_to_token_pool

    def make(orig: Any) -> Callable[..., None]:
        def cache_unfinished(req: Any, chunked: bool = False, row_read: Any = None) -> None:
            during(pool, "write", lambda index, values: None, lambda: orig(req, chunked, row_read))

        return cache_unfinished

    wrap(tree, "cache_unfinished_req", make)


def session_extra_lock(mm: Any) -> None:
    def make(orig: Any) -> Callable[[str], None]:
        def open_session(session_id: str) -> None:
            orig(session_id)
            slot = mm.sessions[session_id]

            def make_restore(restore: Any) -> Callable[..., None]:
                def restore_into(req: Any, *args: Any, **kwargs: Any) -> None:
                    restore(req, *args, **kwargs)
                    if req.last_node is not None and req.last_node is not mm.tree_cache.root_node:
                        mm.tree_cache.inc_lock_ref(req.last_node)  # nobody releases this one

                return restore_into

            wrap(slot, "restore_into", make_restore)

        return open_session

    wrap(mm, "open_session", make)


def release_keeps_overshoot(mm: Any) -> None:
    """A release that forgets where its request stopped: a stop inside the last speculative
    run, and the tokens after it (which the client never received) enter the tree anyway,
    as SGLang 0.5.16 caches them (kvpool's rules keep only the tokens through the stop)."""

    def make(orig: Any) -> Callable[[Any], int]:
        def owned(req: Any) -> int:
            if mm._session_of(req) is None:
                return int(req.kv_committed_len)
            return int(orig(req))

        return owned

    wrap(mm, "_owned_len", make)


def handover_keeps_overshoot(mm: Any) -> None:
    """A session turn that stopped inside its last speculative run hands its session every
    committed token: the next turn's prompt continues from the stop, but the session's KV
    holds the overshoot (what SGLang's streaming session trims, #22897)."""

    def make(orig: Any) -> Callable[[Any], int]:
        def owned(req: Any) -> int:
            if mm._session_of(req) is not None:
                return int(req.kv_committed_len)
            return int(orig(req))

        return owned

    wrap(mm, "_owned_len", make)


def handover_keeps_reserve(mm: Any) -> None:
    """A session keeps its finished turn's over-allocation (a speculative reserve) until the
    next turn, instead of freeing it at the hand-over as SGLang's streaming sessions do
    (``_trim_overshoot``): the slots stay out of the pool between turns."""

    def make(orig: Any) -> Callable[[str], None]:
        def open_session(session_id: str) -> None:
            orig(session_id)
            slot = mm.sessions[session_id]

            def make_take(take: Any) -> Callable[..., None]:
                def take_from(req: Any, *args: Any, **kwargs: Any) -> None:
                    allocated = req.kv_allocated_len
                    alloc = mm.token_to_kv_pool_allocator
                    during(alloc, "free", lambda *a, **k: None,
                           lambda: during(alloc, "free_segment", lambda *a, **k: None,
                                          lambda: take(req, *args, **kwargs)))  # fmt: skip
                    slot.kv_allocated_len = allocated  # the reserve stays the session's

                return take_from

            wrap(slot, "take_from", make_take)

        return open_session

    wrap(mm, "open_session", make)


def hybrid_stop_caches_state(mm: Any) -> None:
    """A hybrid (Mamba) request that stopped inside its last speculative run is cached as if
    it had stopped at its last token: its key is cut at the stop, but the state it donates ran
    past the stop (what SGLang 0.5.23's scheduler prevents with ``skip_radix_cache_insert``)."""

    def make(orig: Any) -> Callable[..., None]:
        def release(req: Any, is_insert: bool = True) -> None:
            req.kv_committed_len = mm._owned_len(req)  # the release sees no stop
            orig(req, is_insert)

        return release

    wrap(mm, "release_kv_cache", make)

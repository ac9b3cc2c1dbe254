"""The scheduler's Mamba steps over a :class:`HybridReqToTokenPool`, as hooks a lifecycle calls.

SGLang spreads these over its scheduler and batch code; each function here is one of them:

- :func:`admit` (``alloc_req_slots``): when fewer Mamba slots are schedulable than a headroom of
  ``MAMBA_STATE_PER_REQ_*`` per request, ask the prefix cache to evict cached states first; then
  allocate. kvpool refuses cleanly (None, nothing changed) where SGLang raises or asserts.
- :func:`stage_cow` (the end of a prefix match): give the request a slot of its own and record
  the cached state to copy into it before its next forward. The cached slot itself is never
  handed to the request: the request's forward would overwrite the tree's checkpoint in place.
- :func:`prepare_forward` (the batch's deferred copy-on-write and clear): copy staged states,
  zero the fresh slots that need it.
- :func:`forward_state` (the model's forward): write each request's new state tag.
- :func:`release_waiting` (abort or rejection of a request that is not running): return the
  Mamba slot a prefix match may already have given it.
- :func:`release_running` (finish, abort or retract of a running request, also inside prefill):
  free its Mamba slot and track buffers (except one donated to the tree) and its row.

Every function validates before its first change: on an error nothing has changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvpool.errors import DoubleFreeError, InvalidArgumentError
from kvpool.protocols.requests import MambaReqLike
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool

MAMBA_STATE_PER_REQ_PREFIX_CACHE = 3
"""Admission headroom per request with a Mamba prefix cache: the running state plus two
track buffers (SGLang's constant)."""
MAMBA_STATE_PER_REQ_NO_CACHE = 1
"""Admission headroom per request without a prefix cache: the running state only."""


def admission_headroom(num_reqs: int, with_cache: bool) -> int:
    """Mamba slots the scheduler wants free before admitting ``num_reqs`` requests."""
    per_req = MAMBA_STATE_PER_REQ_PREFIX_CACHE if with_cache else MAMBA_STATE_PER_REQ_NO_CACHE
    return num_reqs * per_req


def admit(
    pool: HybridReqToTokenPool,
    reqs: Sequence[MambaReqLike],
    evict_mamba: Callable[[int], int] | None = None,
) -> list[int] | None:
    """Admit a batch: rows and Mamba slots for every request, or None with nothing changed
    (besides what ``evict_mamba(n)``, the prefix cache's eviction of ``n`` cached states, freed)
    when too few are free even after eviction. Misuse raises as :meth:`pool.alloc` does."""
    pool.check_alloc(reqs)
    headroom = admission_headroom(len(reqs), evict_mamba is not None)
    available = pool.mamba_allocator.schedulable_available_size()
    if available < headroom and evict_mamba is not None:
        evict_mamba(headroom - available)
    return pool.alloc(reqs)


def stage_cow(pool: HybridReqToTokenPool, req: MambaReqLike, src_slot: int) -> bool:
    """Record a copy of cached state ``src_slot`` into the request's own slot (allocated now if
    it has none); False, nothing changed, when no slot is free. InvalidArgumentError when the
    request already holds ``src_slot`` itself."""
    (src,) = pool.mamba_pool.check_slots([src_slot])
    if req.mamba_pool_idx == src:
        raise InvalidArgumentError(f"request holds the cached slot {src} it would copy")
    if req.mamba_pool_idx is None:
        got = pool.mamba_allocator.alloc(1)
        if got is None:
            return False
        req.mamba_pool_idx = got[0]
    req.mamba_cow_src_index = src
    req.mamba_needs_clear = False
    return True


def prepare_forward(pool: HybridReqToTokenPool, reqs: Sequence[MambaReqLike]) -> tuple[int, int]:
    """The deferred Mamba work of a batch: copy each staged cached state into its request's
    slot, zero the slots marked ``mamba_needs_clear``; both marks are consumed. Returns
    ``(copied, cleared)`` counts (slots)."""
    src: list[int] = []
    dst: list[int] = []
    clear: list[int] = []
    for req in reqs:
        if req.mamba_pool_idx is None:
            raise InvalidArgumentError("a request in the batch holds no Mamba slot")
        if req.mamba_cow_src_index is not None:
            src.append(req.mamba_cow_src_index)
            dst.append(req.mamba_pool_idx)
        elif req.mamba_needs_clear:
            clear.append(req.mamba_pool_idx)
    pool.mamba_pool.check_slots(clear)
    if len(set(dst + clear)) != len(dst + clear):
        raise InvalidArgumentError("two requests of the batch share a Mamba slot")
    pool.mamba_pool.copy_from(src, dst)
    pool.mamba_pool.clear_slots(clear)
    for req in reqs:
        req.mamba_cow_src_index = None
        req.mamba_needs_clear = False
    return len(dst), len(clear)


def forward_state(
    pool: HybridReqToTokenPool, reqs: Sequence[MambaReqLike], tags: Sequence[int]
) -> None:
    """The forward pass wrote each request's new state: ``tags[i]`` into its slot (the caller
    computes it from the request's history with :func:`kvpool.tags.mamba_state_tag`). A request
    with a copy or clear still pending is InvalidArgumentError: its state is not ready."""
    for req in reqs:
        if (
            req.mamba_pool_idx is None
            or req.mamba_cow_src_index is not None
            or req.mamba_needs_clear
        ):
            raise InvalidArgumentError("forward on a request whose Mamba state is not ready")
    pool.mamba_pool.write_state(
        [r.mamba_pool_idx for r in reqs if r.mamba_pool_idx is not None], tags
    )


def release_waiting(pool: HybridReqToTokenPool, req: MambaReqLike) -> list[int]:
    """A request dropped before it ran (aborted while waiting, or refused by admission) returns
    the Mamba slot a prefix match gave it; returns the slots freed (none or one). A request
    holding a row is running: InvalidArgumentError (use :func:`release_running`)."""
    if req.req_pool_idx is not None:
        raise InvalidArgumentError("request holds a row: it is running, not waiting")
    slot = req.mamba_pool_idx
    if slot is not None:
        pool.mamba_allocator.free([slot])
    req.mamba_pool_idx = None
    req.mamba_cow_src_index = None
    req.mamba_needs_clear = False
    return [] if slot is None else [slot]


def release_running(
    pool: HybridReqToTokenPool, req: MambaReqLike, keep: int | None = None, donate: bool = False
) -> list[int]:
    """Finish, abort or retract of a running request (chunked or not): its Mamba slot and track
    buffers go back, then its row. ``keep`` (a track entry) or ``donate`` (the running slot
    itself: a finish that inserts its final state into the prefix cache without track buffers)
    names a slot that goes to the tree instead; returns the donated slots (none or one)."""
    if req.req_pool_idx is None:
        raise InvalidArgumentError("request holds no row: it is not running")
    if donate and keep is not None:
        raise InvalidArgumentError("donate the running slot or keep a track buffer, not both")
    row = pool._check_row(req.req_pool_idx)
    if row in pool._free_set:  # checked before the Mamba slots go back, so nothing changes
        raise DoubleFreeError("row is already free", [row])
    slot, track = req.mamba_pool_idx, list(req.mamba_ping_pong_track_buffer or ())
    if not donate:
        pool.free_mamba_cache(req, keep)
        pool.free(req)
        return [] if keep is None else [track[keep]]
    if slot is None:
        raise DoubleFreeError("request holds no Mamba slot (mamba_pool_idx is None)")
    pool.mamba_allocator.free(track)
    req.mamba_pool_idx = None
    req.mamba_needs_clear = False
    req.mamba_cow_src_index = None
    req.mamba_ping_pong_track_buffer = None
    req.mamba_next_track_idx = None
    pool.free(req)
    return [slot]


__all__ = [
    "MAMBA_STATE_PER_REQ_NO_CACHE",
    "MAMBA_STATE_PER_REQ_PREFIX_CACHE",
    "admission_headroom",
    "admit",
    "forward_state",
    "prepare_forward",
    "release_running",
    "release_waiting",
    "stage_cow",
]

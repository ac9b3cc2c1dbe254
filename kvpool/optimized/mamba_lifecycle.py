"""The scheduler's Mamba steps over a :class:`HybridReqToTokenPool` (optimized twin).

Same functions, results and errors as :mod:`kvpool.reference.mamba_lifecycle` (read its
docstring for what each SGLang step is); slots are the twin's int64 tensors, and each batch step
is one indexed copy or store per buffer. The misuse checks that compare slot values (a request
copying its own slot, two requests of a batch sharing one) sync and run in checked mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvpool.errors import DoubleFreeError, InvalidArgumentError
from kvpool.optimized.hybrid_req_to_token_pool import HybridReqToTokenPool, TorchMambaReq
from kvpool.reference.mamba_lifecycle import (
    MAMBA_STATE_PER_REQ_NO_CACHE,
    MAMBA_STATE_PER_REQ_PREFIX_CACHE,
    admission_headroom,
)


def admit(
    pool: HybridReqToTokenPool,
    reqs: Sequence[TorchMambaReq],
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


def stage_cow(pool: HybridReqToTokenPool, req: TorchMambaReq, src_slot: int) -> bool:
    """Record a copy of cached state ``src_slot`` into the request's own slot (see the
    reference); the source is kept as a one-element tensor, as SGLang keeps a node's value."""
    src = pool.mamba_pool.check_slots([src_slot])
    if pool.checked and req.mamba_pool_idx is not None and int(req.mamba_pool_idx) == src_slot:
        raise InvalidArgumentError(f"request holds the cached slot {src_slot} it would copy")
    if req.mamba_pool_idx is None:
        got = pool.mamba_allocator.alloc(1)
        if got is None:
            return False
        req.mamba_pool_idx = got[0]
    req.mamba_cow_src_index = src
    req.mamba_needs_clear = False
    return True


def _one(slot: object) -> torch.Tensor:
    return torch.as_tensor(slot, dtype=torch.int64).reshape(1)


def prepare_forward(pool: HybridReqToTokenPool, reqs: Sequence[TorchMambaReq]) -> tuple[int, int]:
    """The batch's deferred copies and clears, one indexed copy and one store per buffer
    (see the reference). Returns ``(copied, cleared)`` counts (slots)."""
    src: list[torch.Tensor] = []
    dst: list[torch.Tensor] = []
    clear: list[torch.Tensor] = []
    for req in reqs:
        if req.mamba_pool_idx is None:
            raise InvalidArgumentError("a request in the batch holds no Mamba slot")
        if req.mamba_cow_src_index is not None:
            src.append(_one(req.mamba_cow_src_index))
            dst.append(_one(req.mamba_pool_idx))
        elif req.mamba_needs_clear:
            clear.append(_one(req.mamba_pool_idx))
    empty = torch.empty(0, dtype=torch.int64, device=pool.device)
    src_t, dst_t = torch.cat(src) if src else empty, torch.cat(dst) if dst else empty
    clear_t = torch.cat(clear) if clear else empty
    pool.mamba_pool.check_slots(clear_t)
    if pool.checked:
        named = dst_t.tolist() + clear_t.tolist()
        if len(set(named)) != len(named):
            raise InvalidArgumentError("two requests of the batch share a Mamba slot")
    pool.mamba_pool.copy_from(src_t, dst_t)
    pool.mamba_pool.clear_slots(clear_t)
    for req in reqs:
        req.mamba_cow_src_index = None
        req.mamba_needs_clear = False
    return len(dst), len(clear)


def forward_state(
    pool: HybridReqToTokenPool, reqs: Sequence[TorchMambaReq], tags: Sequence[int]
) -> None:
    """The forward pass wrote ``tags[i]`` into each request's slot (see the reference)."""
    for req in reqs:
        if (
            req.mamba_pool_idx is None
            or req.mamba_cow_src_index is not None
            or req.mamba_needs_clear
        ):
            raise InvalidArgumentError("forward on a request whose Mamba state is not ready")
    slots = [_one(r.mamba_pool_idx) for r in reqs]
    empty = torch.empty(0, dtype=torch.int64, device=pool.device)
    pool.mamba_pool.write_state(torch.cat(slots) if slots else empty, list(tags))


def release_waiting(pool: HybridReqToTokenPool, req: TorchMambaReq) -> torch.Tensor:
    """A request dropped before it ran returns the Mamba slot a prefix match gave it (see the
    reference); returns the slots freed (an int64 tensor of none or one)."""
    if req.req_pool_idx is not None:
        raise InvalidArgumentError("request holds a row: it is running, not waiting")
    slot = req.mamba_pool_idx
    if slot is not None:
        pool.mamba_allocator.free(_one(slot))
    req.mamba_pool_idx = None
    req.mamba_cow_src_index = None
    req.mamba_needs_clear = False
    return torch.empty(0, dtype=torch.int64) if slot is None else _one(slot)


def release_running(
    pool: HybridReqToTokenPool, req: TorchMambaReq, keep: int | None = None, donate: bool = False
) -> torch.Tensor:
    """Finish, abort or retract of a running request (see the reference): Mamba slot and
    track buffers except the one kept (track entry ``keep``) or donated (the running slot),
    then the row; returns the donated slots (an int64 tensor of none or one)."""
    if req.req_pool_idx is None:
        raise InvalidArgumentError("request holds no row: it is not running")
    if donate and keep is not None:
        raise InvalidArgumentError("donate the running slot or keep a track buffer, not both")
    row = pool._check_row(req.req_pool_idx)
    if pool.checked and row in pool.free_slots:  # before the Mamba slots go back
        raise DoubleFreeError("row is already free", [row])
    slot, track = req.mamba_pool_idx, req.mamba_ping_pong_track_buffer
    if not donate:
        pool.free_mamba_cache(req, keep)
        pool.free(req)
        kept = torch.empty(0, dtype=torch.int64) if keep is None else track[keep : keep + 1]
        return kept
    if slot is None:
        raise DoubleFreeError("request holds no Mamba slot (mamba_pool_idx is None)")
    if track is not None:
        pool.mamba_allocator.free(track)
    req.mamba_pool_idx = None
    req.mamba_needs_clear = False
    req.mamba_cow_src_index = None
    req.mamba_ping_pong_track_buffer = None
    req.mamba_next_track_idx = None
    pool.free(req)
    return _one(slot)


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

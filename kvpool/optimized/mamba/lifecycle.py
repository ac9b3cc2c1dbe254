"""The scheduler's Mamba steps over a :class:`HybridReqToTokenPool` (optimized twin).

Same functions, results and errors as :mod:`kvpool.reference.mamba.lifecycle` (read its
docstring for what each SGLang step is). Slots are host ints, as in the twin's pool; the device
work of a batch (the copies, the clears, the forward's state writes) is one host-to-device index
copy and one indexed copy or store per state buffer, with no device-to-host sync.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvpool.errors import DoubleFreeError, InvalidArgumentError
from kvpool.host_checks import int_list
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.protocols.requests import MambaReqLike
from kvpool.reference.mamba.lifecycle import (
    admission_headroom,
)
from kvpool.reference.mamba.pool import check_tags


def _index(pool: HybridReqToTokenPool, slots: list[int]) -> torch.Tensor:
    return torch.tensor(slots, dtype=torch.int64).to(pool.device, non_blocking=True)


def admit(
    pool: HybridReqToTokenPool,
    reqs: Sequence[MambaReqLike],
    evict_mamba: Callable[[int], int] | None = None,
) -> list[int] | None:
    """Admit a batch, evicting cached states first when short of the headroom (see the
    reference); None with nothing changed (but the eviction) when slots or rows are short."""
    if evict_mamba is None:  # nothing changes before alloc, which validates the batch itself
        return pool.alloc(reqs)
    pool.check_alloc(reqs)  # misuse raises before the eviction changes anything
    headroom = admission_headroom(len(reqs), True)
    available = pool.mamba_allocator.schedulable_available_size()
    if available < headroom:
        evict_mamba(headroom - available)
    return pool.alloc(reqs)


def stage_cow(pool: HybridReqToTokenPool, req: MambaReqLike, src_slot: int) -> bool:
    """Record a copy of cached state ``src_slot`` into the request's own slot (see the
    reference); False, nothing changed, when no slot is free."""
    (src,) = pool.mamba_pool.check_slots_host([src_slot])
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
    """The batch's deferred copies and clears, one indexed copy and one store per buffer
    (see the reference). Returns ``(copied, cleared)`` counts (slots)."""
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
    pool.mamba_pool.check_slots_host(src + dst + clear)
    if len(set(dst + clear)) != len(dst + clear) or set(src) & set(dst):
        raise InvalidArgumentError("two requests of the batch share a Mamba slot")
    if dst:
        pool.mamba_pool.copy_from(_index(pool, src), _index(pool, dst))
    if clear:
        pool.mamba_pool.clear_slots(_index(pool, clear))
    for req in reqs:
        req.mamba_cow_src_index = None
        req.mamba_needs_clear = False
    return len(dst), len(clear)


def forward_state(
    pool: HybridReqToTokenPool, reqs: Sequence[MambaReqLike], tags: Sequence[int]
) -> None:
    """The forward pass wrote ``tags[i]`` into each request's slot (see the reference)."""
    slots: list[int] = []
    for req in reqs:
        if (
            req.mamba_pool_idx is None
            or req.mamba_cow_src_index is not None
            or req.mamba_needs_clear
        ):
            raise InvalidArgumentError("forward on a request whose Mamba state is not ready")
        slots.append(req.mamba_pool_idx)
    pool.mamba_pool.check_slots_host(slots)
    if len(tags) != len(slots) or len(set(slots)) != len(slots):
        raise InvalidArgumentError(f"{len(tags)} tags for {len(slots)} distinct slots")
    # host tags: checked here in both modes (integers in range, as the reference's write_state
    # checks them), then handed over as int64 (write_state stores them as float32, exactly)
    host_tags = int_list("tags", tags)
    check_tags(host_tags)
    values = torch.tensor(host_tags, dtype=torch.int64).to(pool.device, non_blocking=True)
    # write_state's checks passed above (slots in range and distinct, one tag in range each):
    # its store only, without reading both lists back from the tensors
    pool.mamba_pool._store_state(_index(pool, slots), values.to(torch.float32))


def release_waiting(pool: HybridReqToTokenPool, req: MambaReqLike) -> list[int]:
    """A request dropped before it ran returns the Mamba slot a prefix match gave it (see the
    reference); returns the slots freed (none or one)."""
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
    """Finish, abort or retract of a running request (see the reference): Mamba slot and
    track buffers except the one kept (track entry ``keep``) or donated (the running slot),
    then the row; returns the donated slots (none or one)."""
    if req.req_pool_idx is None:
        raise InvalidArgumentError("request holds no row: it is not running")
    if donate and keep is not None:
        raise InvalidArgumentError("donate the running slot or keep a track buffer, not both")
    row = pool._check_row(req.req_pool_idx)
    if pool._free_set[row]:  # checked before the Mamba slots go back, so nothing changes
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
    "admit",
    "forward_state",
    "prepare_forward",
    "release_running",
    "release_waiting",
    "stage_cow",
]

"""HybridReqToTokenPool, MambaSlotAllocator and MambaPool (reference): contracts, refusals that
change nothing, typed misuse errors; the twin (checked) answers every case the same way."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

import pytest

from kvpool import optimized, reference
from kvpool.errors import (
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    KVPoolError,
    ReservedIndexError,
)
from kvpool.optimized.options import TwinOptions
from kvpool.testing.machines.hybrid import MachineMambaReq as Req

CHECKED = TwinOptions.make(checked=True)
TWINS = pytest.mark.parametrize("twin", [reference, optimized], ids=["reference", "optimized"])


def make(twin: Any, *args: Any, **kw: Any) -> Any:
    if twin is optimized:
        kw["options"] = CHECKED
    return twin.HybridReqToTokenPool(*args, **kw)


def unchanged(pool: Any, action: Callable[[], object], error: type[KVPoolError] | None) -> None:
    before = pool.hybrid_snapshot()
    if error is None:
        assert action() is None
    else:
        with pytest.raises(error):
            action()
    assert pool.hybrid_snapshot() == before


@TWINS
def test_allocator_queue_order_and_groups(twin: Any) -> None:
    alloc = (
        twin.MambaSlotAllocator(5)
        if twin is reference
        else twin.MambaSlotAllocator(5, options=CHECKED)
    )
    assert list(alloc.alloc(2)) == [1, 2] and alloc.available_size() == 3
    alloc.free([2, 1])
    assert list(alloc.snapshot().free_slots) == [3, 4, 5, 2, 1]  # freed slots join the tail
    alloc.alloc_group_begin(2)
    assert alloc.snapshot().group_slots == (3, 4) and alloc.available_size() == 3
    assert list(alloc.alloc(1)) == [3]
    with pytest.raises(DoubleFreeError):  # a prefetched slot is not held by anyone
        alloc.free([4])
    alloc.alloc_group_end()
    assert alloc.snapshot().free_slots == (5, 2, 1, 4) and not alloc.snapshot().in_group
    assert alloc.alloc(5) is None and alloc.available_size() == 4
    for bad, err in (
        ([0], ReservedIndexError),
        ([6], IndexOutOfRangeError),
        ([5], DoubleFreeError),
    ):
        with pytest.raises(err):
            alloc.free(bad)
    with pytest.raises(DoubleFreeError):
        alloc.free([3, 3])
    with pytest.raises(InvalidArgumentError):
        alloc.alloc(-1)
    with pytest.raises(ConfigError):
        twin.MambaSlotAllocator(0)


@TWINS
def test_alloc_refuses_for_want_of_slots_and_changes_nothing(twin: Any) -> None:
    pool = make(twin, 3, 8, 4, track_buffers=1)
    a, b, c = Req(), Req(), Req()
    assert pool.alloc([a, b]) == [2, 3]  # a fresh table hands out its highest rows (lifo)
    assert (a.mamba_pool_idx, a.mamba_ping_pong_track_buffer, b.mamba_pool_idx) == (1, [2], 3)
    unchanged(pool, lambda: pool.alloc([c]), None)  # a row is free, two slots are not
    assert c.req_pool_idx is None and c.mamba_pool_idx is None
    unchanged(pool, lambda: pool.free_mamba_cache(Req()), DoubleFreeError)
    unchanged(pool, lambda: pool.free_mamba_cache(a, 1), InvalidArgumentError)
    pool.free_mamba_cache(a, 0)  # track slot 2 kept (donated)
    assert pool.mamba_allocator.snapshot().free_slots == (1,)
    assert a.mamba_pool_idx is None and a.mamba_ping_pong_track_buffer is None


@TWINS
def test_kept_slot_must_be_held_and_unshared(twin: Any) -> None:
    pool = make(twin, 3, 8, 4)
    a = Req()
    pool.alloc([a])
    stray = Req(mamba_pool_idx=2)  # slot 2 is free: keeping it would share a free slot
    unchanged(pool, lambda: pool.alloc([stray]), InvalidArgumentError)
    twins = [Req(mamba_pool_idx=1), Req(mamba_pool_idx=1)]
    unchanged(pool, lambda: pool.alloc(twins), InvalidArgumentError)


@TWINS
def test_steps_validate_before_changing(twin: Any) -> None:
    steps = import_module(f"{twin.__name__}.mamba.lifecycle")
    pool = make(twin, 3, 8, 4)
    a = Req()
    steps.admit(pool, [a])
    unchanged(pool, lambda: steps.forward_state(pool, [a], [5]), InvalidArgumentError)  # clear due
    unchanged(pool, lambda: steps.release_waiting(pool, a), InvalidArgumentError)
    unchanged(pool, lambda: steps.release_running(pool, Req()), InvalidArgumentError)
    unchanged(pool, lambda: steps.stage_cow(pool, Req(), 0), ReservedIndexError)
    assert steps.prepare_forward(pool, [a]) == (0, 1)
    unchanged(pool, lambda: steps.forward_state(pool, [a, a], [5, 6]), InvalidArgumentError)
    steps.forward_state(pool, [a], [5])
    assert pool.mamba_pool.state_tags([1]) == [5]
    unchanged(pool, lambda: pool.mamba_pool.copy_from([1], [1]), InvalidArgumentError)
    assert list(steps.release_running(pool, a, donate=True)) == [1]  # the tree now holds 1
    assert pool.mamba_allocator.snapshot().free_slots == (2, 3, 4)


@TWINS
def test_alloc_inside_a_group_takes_single_slots_from_the_group(twin: Any) -> None:
    """SGLang allocates per request (one running slot, then the track buffers): inside an open
    alloc group each single-slot call takes the group's next prefetched slot, the others come
    from the free list (found against SGLang 0.5.16's own pool)."""
    pool = make(twin, 4, 16, 8, track_buffers=1)
    pool.mamba_allocator.alloc_group_begin(2)  # slots 1 and 2 prefetched
    a, b = Req(), Req()
    rows = pool.alloc([a, b])
    assert rows is not None and len(set(rows)) == 2
    assert (a.mamba_pool_idx, a.mamba_ping_pong_track_buffer) == (1, [2])
    assert (b.mamba_pool_idx, b.mamba_ping_pong_track_buffer) == (3, [4])
    assert pool.mamba_allocator.snapshot().free_slots == (5, 6, 7, 8)

    small = make(twin, 4, 16, 3, track_buffers=2)
    small.mamba_allocator.alloc_group_begin(1)  # slot 1 prefetched; 2 and 3 free
    unchanged(small, lambda: small.alloc([Req(), Req()]), None)  # needs 2 x (1 + 2) slots
    c = Req()
    assert small.alloc([c]) is not None
    assert (c.mamba_pool_idx, c.mamba_ping_pong_track_buffer) == (1, [2, 3])

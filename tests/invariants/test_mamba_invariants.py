"""Each Mamba invariant fires on a hand-made bad snapshot or context, naming the offending
slots or rows, and stays quiet on good ones; the reference's own snapshots pass."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.errors import InvariantViolation
from kvpool.invariants import INVARIANTS
from kvpool.invariants.mamba import MambaContext, MambaReqView, check_mamba
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.snapshot import (
    HybridReqToTokenSnapshot,
    MambaAllocatorSnapshot,
    MambaPoolSnapshot,
    ReqToTokenSnapshot,
)

IDS = (
    "INV-MAMBA-ONE-OWNER",
    "INV-MAMBA-ACCOUNTING",
    "INV-MAMBA-REQ-SLOT",
    "INV-MAMBA-CHECKPOINT",
    "INV-MAMBA-STATE-INTEGRITY",
)


def good() -> tuple[HybridReqToTokenSnapshot, MambaContext]:
    """Slots 1..5: request A (row 1) holds slot 2 in state 11, request B (row 2) slot 4 in
    state 12 (pending a clear), the tree holds slot 5 (state 99); 1 and 3 are free."""
    tags = (0, 7, 11, 7, 5, 99)
    snap = HybridReqToTokenSnapshot(
        table=ReqToTokenSnapshot(4, 8, (4, 3), (0, 1, 1, 0, 0)),
        mamba_allocator=MambaAllocatorSnapshot(5, (3, 1)),
        mamba_pool=MambaPoolSnapshot(5, 2, (tags, tags), (tags, tags)),
        mamba_mapping=(0, 2, 4, 0, 0),
    )
    ctx = MambaContext(
        reqs=(MambaReqView("A", 1, 2, (), 11), MambaReqView("B", 2, 4, (), None)),
        checkpoints=((5, 99),),
    )
    return snap, ctx


def fires(invariant_id: str, indices: tuple[int, ...], snap: object, ctx: object) -> None:
    assert isinstance(snap, HybridReqToTokenSnapshot) and isinstance(ctx, MambaContext)
    with pytest.raises(InvariantViolation) as info:
        check_mamba(snap, ctx)
    assert info.value.invariant_id == invariant_id, str(info.value)
    assert info.value.indices == indices


def test_good_snapshot_passes_every_check() -> None:
    snap, ctx = good()
    assert check_mamba(snap, ctx) == len(IDS)
    for inv in IDS:
        assert "mamba" in INVARIANTS[inv].scopes and INVARIANTS[inv].description


def test_one_owner() -> None:
    snap, ctx = good()
    twice = dataclasses.replace(snap, mamba_allocator=MambaAllocatorSnapshot(5, (3, 1, 3)))
    fires("INV-MAMBA-ONE-OWNER", (3,), twice, ctx)
    shared = dataclasses.replace(ctx, checkpoints=((5, 99), (2, 11)))  # tree and A share 2
    fires("INV-MAMBA-ONE-OWNER", (2,), snap, shared)
    freed = dataclasses.replace(snap, mamba_allocator=MambaAllocatorSnapshot(5, (3, 1, 4)))
    fires("INV-MAMBA-ONE-OWNER", (4,), freed, ctx)  # B's slot is also free
    zero = dataclasses.replace(snap, mamba_allocator=MambaAllocatorSnapshot(5, (3, 1, 0)))
    fires("INV-MAMBA-ONE-OWNER", (0,), zero, ctx)


def test_accounting() -> None:
    snap, ctx = good()
    leak = dataclasses.replace(snap, mamba_allocator=MambaAllocatorSnapshot(5, (3,)))
    fires("INV-MAMBA-ACCOUNTING", (1,), leak, ctx)
    outside = dataclasses.replace(snap, mamba_allocator=MambaAllocatorSnapshot(5, (3, 1, 6)))
    fires("INV-MAMBA-ACCOUNTING", (6,), outside, ctx)
    # Unknown owners: a slot nobody names is not a leak.
    assert check_mamba(leak, dataclasses.replace(ctx, owners_known=False)) == len(IDS)


def test_req_slot() -> None:
    snap, ctx = good()
    wrong = dataclasses.replace(snap, mamba_mapping=(0, 2, 1, 0, 0))
    fires("INV-MAMBA-REQ-SLOT", (2,), wrong, ctx)
    slotless = dataclasses.replace(
        ctx, reqs=(ctx.reqs[0], MambaReqView("B", 2, None)), checkpoints=((5, 99), (4, 5))
    )
    fires("INV-MAMBA-REQ-SLOT", (2,), snap, slotless)


def test_checkpoint_written_in_place() -> None:
    snap, ctx = good()
    tags = (0, 7, 11, 7, 5, 13)  # the tree's slot 5 now holds a request's newer state
    overwritten = dataclasses.replace(
        snap, mamba_pool=MambaPoolSnapshot(5, 2, (tags, tags), (tags, tags))
    )
    fires("INV-MAMBA-CHECKPOINT", (5,), overwritten, ctx)


def test_state_integrity() -> None:
    snap, ctx = good()
    tags = (0, 7, 12, 7, 5, 99)  # A's slot holds another history's state
    stolen = dataclasses.replace(
        snap, mamba_pool=MambaPoolSnapshot(5, 2, (tags, tags), (tags, tags))
    )
    fires("INV-MAMBA-STATE-INTEGRITY", (2,), stolen, ctx)
    right, half = (0, 7, 11, 7, 5, 99), (0, 7, 0, 7, 5, 99)  # layer 1's conv state not written
    torn = dataclasses.replace(
        snap, mamba_pool=MambaPoolSnapshot(5, 2, (right, half), (right, right))
    )
    fires("INV-MAMBA-STATE-INTEGRITY", (2,), torn, ctx)


def test_reference_pool_snapshots_pass() -> None:
    from kvpool.reference.mamba import lifecycle as life
    from kvpool.testing.machines.hybrid import MachineMambaReq as Req

    pool = HybridReqToTokenPool(4, 8, 6, num_mamba_layers=2, track_buffers=2)
    a = Req()
    assert life.admit(pool, [a]) == [4]
    life.prepare_forward(pool, [a])
    life.forward_state(pool, [a], [11])
    view = MambaReqView(
        "a", a.req_pool_idx, a.mamba_pool_idx, tuple(a.mamba_ping_pong_track_buffer or ()), 11
    )
    assert check_mamba(pool.hybrid_snapshot(), MambaContext((view,))) == len(IDS)
    life.release_running(pool, a)
    assert check_mamba(pool.hybrid_snapshot(), MambaContext()) == len(IDS)

"""Each allocator / request-table invariant fires on a hand-made bad snapshot, naming the
offending indices, and stays quiet on good ones; the registry and entry points behave."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from kvpool.errors import InvariantViolation
from kvpool.invariants import (
    INVARIANTS,
    check_all,
    check_allocator,
    check_req_to_token,
    checks_for,
    invariant,
)
from kvpool.invariants.registry import _BY_SCOPE
from kvpool.reference import PagedTokenToKVPoolAllocator, ReqToTokenPool
from kvpool.snapshot import AllocatorSnapshot, PoolSnapshot, ReqToTokenSnapshot, TreeSnapshot


def alloc_snap(**changes: object) -> AllocatorSnapshot:
    """A good paged snapshot: 6 pages of 4 tokens, pages 2 and 5 held."""
    base = AllocatorSnapshot(
        page_size=4,
        num_pages=6,
        size=24,
        free_pages=(1, 3, 4),
        release_pages=(6,),
        need_sort=True,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


HELD = {2, 5}


def rows_snap(**changes: object) -> ReqToTokenSnapshot:
    """A good table snapshot: rows 1..4, rows 1 and 3 held."""
    base = ReqToTokenSnapshot(
        size=4,
        max_context_len=8,
        free_slots=(4, 2),
        req_generation=(0, 2, 1, 1, 0),
        rows=((1, (8, 9, 10, 11, 20, 21)), (3, (12,))),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def fires(invariant_id: str, indices: tuple[int, ...], action: object) -> InvariantViolation:
    assert callable(action)
    with pytest.raises(InvariantViolation) as info:
        action()
    err = info.value
    assert err.invariant_id == invariant_id, str(err)
    assert err.indices == indices
    assert invariant_id in str(err)
    return err


def test_good_snapshots_pass_and_count_checks() -> None:
    n_alloc = len(checks_for("allocator"))
    n_rows = len(checks_for("req_to_token"))
    assert check_allocator(alloc_snap(), HELD) == n_alloc >= 6
    assert check_allocator(alloc_snap()) == n_alloc
    assert check_req_to_token(rows_snap(), {1, 3}, rows_snap(), page_size=4) == n_rows >= 5


def test_no_double_free_in_free_lists() -> None:
    fires("INV-NO-DOUBLE-FREE", (3,), lambda: check_allocator(alloc_snap(release_pages=(3,))))


def test_no_double_free_of_pending_pages() -> None:
    snap = alloc_snap(in_free_group=True, pending_free=(8, 17, 5))  # pages 2, 4, 1
    fires("INV-NO-DOUBLE-FREE", (1, 4), lambda: check_allocator(snap))


def test_no_double_free_of_pending_slot_at_page_size_one() -> None:
    snap = AllocatorSnapshot(1, 4, 4, (1,), (), False, True, (3, 2, 3))
    fires("INV-NO-DOUBLE-FREE", (3,), lambda: check_allocator(snap))


def test_reserved_zero_in_allocator() -> None:
    fires("INV-RESERVED-ZERO", (0,), lambda: check_allocator(alloc_snap(free_pages=(0, 1))))
    fires("INV-RESERVED-ZERO", (0,), lambda: check_allocator(alloc_snap(), HELD | {0}))
    snap = alloc_snap(in_free_group=True, pending_free=(2,))
    fires("INV-RESERVED-ZERO", (0,), lambda: check_allocator(snap))


def test_page_range() -> None:
    fires("INV-PAGE-RANGE", (7, 9), lambda: check_allocator(alloc_snap(free_pages=(1, 9, 7))))
    fires("INV-PAGE-RANGE", (-1,), lambda: check_allocator(alloc_snap(), HELD | {-1}))


def test_token_accounting_leak_and_use_after_free() -> None:
    fires("INV-TOKEN-ACCOUNTING", (5,), lambda: check_allocator(alloc_snap(), {2}))
    fires("INV-TOKEN-ACCOUNTING", (3,), lambda: check_allocator(alloc_snap(), HELD | {3}))


def test_free_group_and_shape() -> None:
    fires("INV-FREE-GROUP", (8,), lambda: check_allocator(alloc_snap(pending_free=(8,))))
    fires("INV-ALLOCATOR-SHAPE", (), lambda: check_allocator(alloc_snap(size=20)))
    fires("INV-ALLOCATOR-SHAPE", (), lambda: check_allocator(alloc_snap(page_size=3)))


def test_row_invariants() -> None:
    fires("INV-RESERVED-ZERO", (0,), lambda: check_req_to_token(rows_snap(free_slots=(4, 0))))
    bad_row = rows_snap(rows=((3, (12, 0)),))
    fires("INV-RESERVED-ZERO", (1,), lambda: check_req_to_token(bad_row))
    fires("INV-ROW-RANGE", (5,), lambda: check_req_to_token(rows_snap(free_slots=(5, 2))))
    fires("INV-ROW-RANGE", (), lambda: check_req_to_token(rows_snap(req_generation=(0, 1))))
    fires("INV-ROW-ACCOUNTING", (2,), lambda: check_req_to_token(rows_snap(free_slots=(2, 4, 2))))
    fires("INV-ROW-ACCOUNTING", (3,), lambda: check_req_to_token(rows_snap(), {1}))
    fires("INV-ROW-ACCOUNTING", (4,), lambda: check_req_to_token(rows_snap(), {1, 3, 4}))


def test_generation_monotonic() -> None:
    newer = rows_snap(req_generation=(0, 3, 1, 2, 0))
    fires(
        "INV-GENERATION-MONOTONIC",
        (1, 3),
        lambda: check_req_to_token(rows_snap(), previous=newer),
    )
    never = rows_snap(req_generation=(0, 2, 1, 0, 0))
    fires("INV-GENERATION-MONOTONIC", (3,), lambda: check_req_to_token(never, {1, 3}))


def test_page_contiguity_names_columns() -> None:
    # Columns 4..5 must sit at offsets 0..1 of one page; column 5 jumps, column 8 is misaligned.
    row = (8, 9, 10, 11, 20, 30, 22, 23, 13)
    snap = rows_snap(rows=((1, row),))
    err = fires("INV-PAGE-CONTIGUITY", (5, 8), lambda: check_req_to_token(snap, page_size=4))
    assert "row 1" in str(err)
    check_req_to_token(snap)  # page size unknown: layout not checked
    check_req_to_token(snap, page_size=1)


def test_real_pools_satisfy_every_invariant() -> None:
    alloc = PagedTokenToKVPoolAllocator(32, 4)
    out = alloc.alloc_extend([0], [0], [6], [6], [-1], 6)
    assert out is not None
    table = ReqToTokenPool(1, 8)
    assert table.alloc([SimpleNamespace(req_pool_idx=None)]) == [1]
    table.write((1, slice(0, 6)), out)
    assert check_allocator(alloc.snapshot(), {s // 4 for s in out}) > 0
    check_req_to_token(table.snapshot([(1, 6)]), {1}, page_size=4)


def idle_pool(allocator: AllocatorSnapshot) -> PoolSnapshot:
    return PoolSnapshot(
        allocator=allocator,
        req_to_token=ReqToTokenSnapshot(2, 4, (2, 1), (0, 0, 0)),
        tree=TreeSnapshot(allocator.page_size, True, "lru", 0, 0),
        max_total_num_tokens=allocator.size,
    )


def test_check_all_runs_component_and_pool_checks() -> None:
    good = idle_pool(PagedTokenToKVPoolAllocator(16, 4).snapshot())
    expected = (
        len(checks_for("allocator")) + len(checks_for("req_to_token")) + len(checks_for("pool"))
    )
    assert check_all(good, good) == expected
    bad = idle_pool(dataclasses.replace(good.allocator, free_pages=(1, 2, 2, 4)))
    fires("INV-NO-DOUBLE-FREE", (2,), lambda: check_all(bad))


def test_registry_records() -> None:
    for inv_id in (
        "INV-NO-DOUBLE-FREE",
        "INV-RESERVED-ZERO",
        "INV-PAGE-RANGE",
        "INV-TOKEN-ACCOUNTING",
        "INV-ROW-ACCOUNTING",
        "INV-GENERATION-MONOTONIC",
        "INV-PAGE-CONTIGUITY",
    ):
        record = INVARIANTS[inv_id]
        assert record.invariant_id == inv_id
        assert record.description and "\n" not in record.description
    assert set(INVARIANTS["INV-RESERVED-ZERO"].scopes) >= {"allocator", "req_to_token"}


def test_register_decorator_and_reregistration() -> None:
    calls: list[int] = []

    @invariant("INV-TEST-ONLY", "a test invariant", scope="pool")
    def first(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
        calls.append(1)

    try:

        @invariant("INV-TEST-ONLY", "a test invariant", scope="pool")
        def second(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
            calls.append(2)

        assert [i for i, _ in checks_for("pool")].count("INV-TEST-ONLY") == 1
        check_all(idle_pool(PagedTokenToKVPoolAllocator(8, 4).snapshot()))
        assert calls == [2]
        with pytest.raises(ValueError):
            invariant("NOT-AN-ID", "x", scope="pool")
        with pytest.raises(ValueError):
            invariant("INV-X", "x", scope="nowhere")
    finally:
        del INVARIANTS["INV-TEST-ONLY"]
        _BY_SCOPE["pool"][:] = [e for e in _BY_SCOPE["pool"] if e[0] != "INV-TEST-ONLY"]

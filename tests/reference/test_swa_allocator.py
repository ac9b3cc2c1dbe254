"""The reference SWA allocators: both pools in step, the mapping, the window, free groups,
backup/restore, typed errors that change nothing, and refusals that change nothing."""

from __future__ import annotations

import pytest

from kvpool.errors import (
    AlignmentError,
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    ReservedIndexError,
)
from kvpool.invariants import check_swa_allocator
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.reference.swa.pure_allocator import PureSWATokenToKVPoolAllocator


def paged(size: int = 32, size_swa: int = 16, ps: int = 4) -> SWATokenToKVPoolAllocator:
    return SWATokenToKVPoolAllocator(size, size_swa, ps)


def test_extend_maps_every_new_full_slot_and_translates_minus_one() -> None:
    a = paged()
    full = a.alloc_extend([0], [0], [6], [6], [-1], 6)
    assert full == [4, 5, 6, 7, 8, 9]
    assert a.translate_loc_from_full_to_swa([-1, *full]) == [-1, 4, 5, 6, 7, 8, 9]
    assert a.available_size() == 16 - 8  # SWA pool: 4 pages, 2 taken
    assert a.full_available_size() == 32 - 8
    check_swa_allocator(a.snapshot(), {1, 2})


def test_decode_continues_both_pools_from_the_translated_last_loc() -> None:
    a = paged()
    full = a.alloc_extend([0], [0], [3], [3], [-1], 3)
    assert full is not None
    a.free_swa([])  # empty is a no-op
    got = a.alloc_decode([4], [4], [full[-1]])
    assert got == [7] and a.translate_loc_from_full_to_swa(got) == [7]
    got = a.alloc_decode([5], [5], [7])  # opens a page in both pools
    assert got == [8] and a.translate_loc_from_full_to_swa(got) == [8]


def test_free_swa_releases_only_the_window_and_zeroes_the_mapping() -> None:
    a = paged()
    full = a.alloc_extend([0], [0], [10], [10], [-1], 10)
    assert full is not None
    before = a.full_available_size()
    a.free_swa(full[:4])  # the first page slid out of the window
    assert a.full_available_size() == before
    assert a.translate_loc_from_full_to_swa(full[:5]) == [0, 0, 0, 0, 8]
    assert a.swa_available_size() == 16 - 8
    a.free(full)  # frees the full pages and the SWA pages still mapped, once each
    assert a.full_available_size() == 32 and a.swa_available_size() == 16
    assert set(a.full_to_swa_index_mapping[:-1]) == {0}
    check_swa_allocator(a.snapshot(), set())


def test_refusal_when_either_pool_is_short_changes_nothing() -> None:
    a = paged(size=32, size_swa=8)
    assert a.alloc_extend([0], [0], [8], [8], [-1], 8) is not None
    snap = a.snapshot()
    assert a.alloc_extend([0], [0], [1], [1], [-1], 1) is None  # SWA pool full, full pool not
    assert a.snapshot() == snap
    full = a.snapshot().full
    assert full.available_size() > 0


def test_decode_refused_by_the_swa_pool_takes_no_full_page() -> None:
    a = paged(size=32, size_swa=8)
    q = a.alloc_extend([0], [0], [8], [8], [-1], 8)
    assert q is not None
    snap = a.snapshot()
    assert a.alloc_decode([9], [9], [q[-1]]) is None
    assert a.snapshot() == snap


def test_free_group_resolves_the_mapping_at_free() -> None:
    a = SWATokenToKVPoolAllocator(8, 8, 1)
    x = a.alloc(3)
    assert x == [1, 2, 3]
    a.free_group_begin()
    a.free([2])
    assert a.translate_loc_from_full_to_swa([2]) == [0]  # resolved now, not at the group end
    assert a.snapshot().swa.pending_free == (2,)
    with pytest.raises(DoubleFreeError):
        a.free([2])
    a.free_group_end()
    assert a.snapshot().swa.free_pages[-1] == 2
    check_swa_allocator(a.snapshot(), {1, 3})


def test_errors_change_nothing() -> None:
    a = paged()
    q = a.alloc_extend([0], [0], [5], [5], [-1], 5)
    assert q is not None
    snap = a.snapshot()
    cases: list[tuple[type[Exception], object]] = [
        (ReservedIndexError, lambda: a.free([1])),
        (IndexOutOfRangeError, lambda: a.free([36])),
        (DoubleFreeError, lambda: a.free([20])),
        (IndexOutOfRangeError, lambda: a.free_swa([99])),
        (IndexOutOfRangeError, lambda: a.translate_loc_from_full_to_swa([-2])),
        (InvalidArgumentError, lambda: a.alloc(4)),
        (AlignmentError, lambda: a.alloc_extend_swa_tail([0], [0], [9], [9], [-1], 9, 4)),
        (InvalidArgumentError, lambda: a.restore_state(("bad",))),
        (InvalidArgumentError, lambda: a.free_group_end()),
        (AlignmentError, lambda: a.alloc_extend([6], [6], [7], [7], [q[-1]], 1)),
    ]
    for error, call in cases:
        assert callable(call)
        with pytest.raises(error):
            call()
        assert a.snapshot() == snap, error


def test_extend_after_the_last_token_lost_its_swa_slot_is_refused() -> None:
    a = paged()
    q = a.alloc_extend([0], [0], [6], [6], [-1], 6)
    assert q is not None
    a.free_swa([q[-1]])  # the whole second page, the last token included
    snap = a.snapshot()
    with pytest.raises(InvalidArgumentError):
        a.alloc_decode([7], [7], [q[-1]])
    assert a.snapshot() == snap


def test_swa_tail_maps_only_the_window() -> None:
    a = paged()
    full = a.alloc_extend_swa_tail([0], [0], [10], [10], [-1], 10, 2)
    assert full is not None
    assert a.translate_loc_from_full_to_swa(full) == [0] * 8 + [4, 5]
    assert a.swa_available_size() == 12
    check_swa_allocator(a.snapshot(), {1, 2, 3})


def test_backup_restore_brings_back_the_mapping() -> None:
    a = paged()
    q = a.alloc_extend([0], [0], [4], [4], [-1], 4)
    assert q is not None
    state = a.backup_state()
    snap = a.snapshot()
    a.alloc_decode([5], [5], [q[-1]])
    a.free_swa(q)
    a.restore_state(state)
    assert a.snapshot() == snap
    a.free_group_begin()
    with pytest.raises(InvalidArgumentError):
        a.backup_state()


def test_clear_keeps_the_tail() -> None:
    a = paged()
    a.alloc_extend([0], [0], [4], [4], [-1], 4)
    a.clear()
    assert a.full_to_swa_index_mapping[-1] == -1
    assert a.available_size() == 16 and a.size == 16 and a.size_full == 32


def test_pure_swa_is_one_pool_with_the_identity_mapping() -> None:
    a = PureSWATokenToKVPoolAllocator(6)
    x = a.alloc(2)
    assert x == [1, 2] and a.translate_loc_from_full_to_swa(x) == x
    a.free([0, 1])  # padding 0 dropped, as SGLang does
    assert a.available_size() == 5
    a.free_swa([2])
    assert a.available_size() == 6
    check_swa_allocator(a.snapshot(), set())
    with pytest.raises(ConfigError):
        PureSWATokenToKVPoolAllocator(8, 2)

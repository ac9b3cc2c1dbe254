"""Unit tests of the reference PagedTokenToKVPoolAllocator: alloc, free, batch ops, errors."""

from __future__ import annotations

import pytest

from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX
from kvpool.errors import (
    AlignmentError,
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    KVPoolError,
    PageSizeError,
    ReservedIndexError,
)
from kvpool.reference import PagedTokenToKVPoolAllocator
from tests.reference.helpers import assert_none_unchanged, assert_refused


def with_free(num_pages: int, page_size: int, free_pages: list[int]) -> PagedTokenToKVPoolAllocator:
    """An allocator whose free list is exactly ``free_pages`` (the rest allocated)."""
    a = PagedTokenToKVPoolAllocator(num_pages * page_size, page_size)
    a.restore_state((tuple(free_pages), ()))
    return a


def test_construction() -> None:
    a = PagedTokenToKVPoolAllocator(32, 4)
    assert (a.num_pages, a.free_pages, a.available_size()) == (8, list(range(1, 9)), 32)
    with pytest.raises(PageSizeError):
        PagedTokenToKVPoolAllocator(24, 3)
    with pytest.raises(PageSizeError):
        PagedTokenToKVPoolAllocator(24, 0)
    with pytest.raises(ConfigError):
        PagedTokenToKVPoolAllocator(30, 4)
    with pytest.raises(ConfigError):
        PagedTokenToKVPoolAllocator(0, 4)


def test_alloc_whole_pages_from_the_head() -> None:
    a = PagedTokenToKVPoolAllocator(16, 4)
    assert a.alloc(8) == [4, 5, 6, 7, 8, 9, 10, 11]
    assert a.free_pages == [3, 4]
    assert a.alloc(0) == []
    assert_refused(a, AlignmentError, lambda: a.alloc(3))
    assert_refused(a, InvalidArgumentError, lambda: a.alloc(-4))
    assert_none_unchanged(a, lambda: a.alloc(12))


def test_free_prepends_sorted_unique_pages() -> None:
    a = PagedTokenToKVPoolAllocator(16, 4)
    a.alloc(12)
    a.free([13, 5, 12, 4])  # pages 3, 1, 3, 1
    assert a.free_pages == [1, 3, 4]
    assert a.alloc(4) == [4, 5, 6, 7]  # LIFO by page


@pytest.mark.parametrize(
    ("slots", "error"),
    [
        ([1], ReservedIndexError),  # a slot of page 0
        ([RESERVED_INDEX], ReservedIndexError),
        ([20], IndexOutOfRangeError),  # (num_pages + 1) * ps == 20
        ([-1], IndexOutOfRangeError),
        ([16], DoubleFreeError),  # page 4 is free
        ([4, 16], DoubleFreeError),
        ([4, 2, 25], IndexOutOfRangeError),
    ],
)
def test_free_errors_change_nothing(slots: list[int], error: type[KVPoolError]) -> None:
    a = PagedTokenToKVPoolAllocator(16, 4)
    a.alloc(12)
    assert_refused(a, error, lambda: a.free(slots))


def test_double_free_names_pages() -> None:
    a = PagedTokenToKVPoolAllocator(16, 4)
    a.alloc(8)
    err = assert_refused(a, DoubleFreeError, lambda: a.free([4, 12, 17]))
    assert isinstance(err, DoubleFreeError)
    assert err.indices == (3, 4)


def test_free_group_deduplicates_pages_across_calls() -> None:
    a = PagedTokenToKVPoolAllocator(16, 4)
    a.alloc(12)
    a.free_group_begin()
    a.free([8, 9])
    a.free([10, 4, 11])  # page 2 again, and page 1
    assert a.free_pages == [4]
    assert a.snapshot().pending_free == (8, 9, 10, 4, 11)
    assert_refused(a, DoubleFreeError, lambda: a.free([16]))
    a.free_group_end()
    assert a.free_pages == [1, 2, 4]


def test_need_sort_prepends_to_release_pages() -> None:
    # SGLang: release_pages = cat(sorted unique freed pages, release_pages), like free_pages.
    a = PagedTokenToKVPoolAllocator(16, 4, need_sort=True)
    a.alloc(16)
    a.free([12, 13])
    a.free([8, 4])
    assert (a.free_pages, a.release_pages) == ([], [1, 2, 3])
    assert a.available_size() == 12
    assert_none_unchanged(a, lambda: a.alloc(16))
    a.free([16])
    assert a.backup_state() == ((), (4, 1, 2, 3))
    assert a.alloc(4) == [4, 5, 6, 7]  # merged (sorted) first
    assert (a.free_pages, a.release_pages) == ([2, 3, 4], [])


def test_alloc_extend_worked_example() -> None:
    # ps 4, free_pages [9, 3, 7], P 6, last_loc 25, S 15: all three parts present.
    a = with_free(10, 4, [9, 3, 7])
    out = a.alloc_extend([6], [6], [15], [15], [25], 9)
    assert out == [26, 27, 36, 37, 38, 39, 12, 13, 14]
    assert a.free_pages == [7]


def test_alloc_extend_batch_order_and_parts() -> None:
    a = with_free(10, 4, [2, 5, 8, 9])
    # r0: empty prefix, 5 tokens -> page 2 whole + tail on page 5.
    # r1: prefix 2 ends at slot 41 (page 10), grows to 3 -> part 1 only, no new page.
    # r2: page-aligned prefix 4 (last_loc 27), grows to 8 -> one whole new page (8).
    out = a.alloc_extend([0, 2, 4], [0, 2, 4], [5, 3, 8], [5, 3, 8], [NO_LAST_LOC, 41, 27], 10)
    assert out == [8, 9, 10, 11, 20, 42, 32, 33, 34, 35]
    assert a.free_pages == [9]


def test_alloc_extend_short_returns_none_unchanged() -> None:
    a = with_free(10, 4, [2])
    assert_none_unchanged(a, lambda: a.alloc_extend([0], [0], [5], [5], [NO_LAST_LOC], 5))
    b = PagedTokenToKVPoolAllocator(16, 4, need_sort=True)
    b.alloc(16)
    b.free([4])
    assert_none_unchanged(b, lambda: b.alloc_extend([0], [0], [5], [5], [NO_LAST_LOC], 5))


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (([1], [1], [3], [3], [NO_LAST_LOC], 2), InvalidArgumentError),  # P > 0 needs last_loc
        (([0], [0], [3], [3], [41], 3), InvalidArgumentError),  # P == 0 needs -1
        (([2], [2], [1], [1], [41], -1), InvalidArgumentError),  # S < P
        (([2], [2], [3], [3], [42], 1), AlignmentError),  # last_loc at the wrong page offset
        (([2], [2], [3], [3], [41], 2), InvalidArgumentError),  # extend_num_tokens wrong
        (([2], [1], [3], [3], [41], 1), InvalidArgumentError),  # cpu copy differs
        (([2], [2], [3], [4], [41], 1), InvalidArgumentError),
        (([2], [2], [3], [3], [41, 5], 1), InvalidArgumentError),  # lengths differ
        (([2], [2], [3], [3], [9], 1), InvalidArgumentError),  # page 2 is free
        (([2], [2], [3], [3], [1], 1), ReservedIndexError),  # page 0
        (([2], [2], [3], [3], [45], 1), IndexOutOfRangeError),  # page 11 > num_pages
    ],
)
def test_alloc_extend_errors(
    args: tuple[list[int], list[int], list[int], list[int], list[int], int],
    error: type[KVPoolError],
) -> None:
    a = with_free(10, 4, [2, 5])
    assert_refused(a, error, lambda: a.alloc_extend(*args))


def test_alloc_decode_opens_a_page_only_at_a_boundary() -> None:
    a = with_free(10, 4, [6, 2])
    # r0 writes token 4 (S 5): (5 - 1) % 4 == 0 -> first slot of page 6.
    # r1 writes token 2 (S 3) after slot 41 -> 42.  r2 first token (S 1) -> page 2.
    assert a.alloc_decode([5, 3, 1], [5, 3, 1], [35, 41, NO_LAST_LOC]) == [24, 42, 8]
    assert a.free_pages == []
    assert_none_unchanged(a, lambda: a.alloc_decode([9], [9], [35]))
    assert a.alloc_decode([4], [4], [42]) == [43]  # no new page needed even with none free


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (([0], [0], [NO_LAST_LOC]), InvalidArgumentError),  # S >= 1
        (([1], [1], [40]), InvalidArgumentError),  # S == 1 needs -1
        (([3], [3], [NO_LAST_LOC]), InvalidArgumentError),
        (([3], [3], [42]), AlignmentError),  # token 1 must sit at offset 1
        (([3], [2], [41]), InvalidArgumentError),
        (([3], [3], [9]), InvalidArgumentError),  # page 2 is free
        (([3, 3], [3, 3], [41]), InvalidArgumentError),
    ],
)
def test_alloc_decode_errors(
    args: tuple[list[int], list[int], list[int]], error: type[KVPoolError]
) -> None:
    a = with_free(10, 4, [2, 5])
    assert_refused(a, error, lambda: a.alloc_decode(*args))


def test_backup_restore_borrow() -> None:
    a = PagedTokenToKVPoolAllocator(16, 4)
    state = a.backup_state()
    assert a.alloc(8) == [4, 5, 6, 7, 8, 9, 10, 11]
    a.restore_state(state)
    assert a.snapshot() == PagedTokenToKVPoolAllocator(16, 4).snapshot()
    assert_refused(a, InvalidArgumentError, lambda: a.restore_state(((5,), ())))


def test_clear_and_page_size_one_paged() -> None:
    a = PagedTokenToKVPoolAllocator(4, 1)
    a.alloc(3)
    a.free([1, 3, 1])  # duplicates name the page once; pages prepended sorted
    assert a.free_pages == [1, 3, 4]
    a.clear()
    assert a.free_pages == [1, 2, 3, 4]

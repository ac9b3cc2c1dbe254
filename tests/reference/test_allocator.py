"""Unit tests of the reference TokenToKVPoolAllocator (page size 1): every operation and error."""

from __future__ import annotations

import pytest

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    KVPoolError,
    ReservedIndexError,
)
from kvpool.reference import TokenToKVPoolAllocator
from tests.reference.helpers import assert_none_unchanged, assert_refused


def test_fresh_state_and_fifo_alloc() -> None:
    a = TokenToKVPoolAllocator(6)
    assert (a.size, a.page_size, a.num_pages) == (6, 1, 6)
    assert a.free_pages == [1, 2, 3, 4, 5, 6]
    assert a.alloc(2) == [1, 2]
    assert a.alloc(0) == []
    assert a.available_size() == 4
    a.free([2, 1])
    assert a.free_pages == [3, 4, 5, 6, 2, 1]  # appended in the order given (FIFO reuse)
    assert a.alloc(5) == [3, 4, 5, 6, 2]


def test_alloc_short_returns_none_unchanged() -> None:
    a = TokenToKVPoolAllocator(3)
    a.alloc(2)
    assert_none_unchanged(a, lambda: a.alloc(2))
    assert a.alloc(1) == [3]


def test_alloc_negative_is_invalid() -> None:
    a = TokenToKVPoolAllocator(3)
    assert_refused(a, InvalidArgumentError, lambda: a.alloc(-1))


@pytest.mark.parametrize(
    ("slots", "error"),
    [
        ([RESERVED_INDEX], ReservedIndexError),
        ([5], IndexOutOfRangeError),
        ([-1], IndexOutOfRangeError),
        ([3], DoubleFreeError),  # never allocated
        ([1, 1], DoubleFreeError),  # twice in one call
        ([1, 0, 5], IndexOutOfRangeError),  # range wins over reserved, before any change
        ([1, 0], ReservedIndexError),
    ],
)
def test_free_errors_change_nothing(slots: list[int], error: type[KVPoolError]) -> None:
    a = TokenToKVPoolAllocator(4)
    a.alloc(2)
    assert_refused(a, error, lambda: a.free(slots))


def test_double_free_names_the_slots() -> None:
    a = TokenToKVPoolAllocator(4)
    a.alloc(2)
    a.free([1])
    err = assert_refused(a, DoubleFreeError, lambda: a.free([2, 1]))
    assert isinstance(err, DoubleFreeError)
    assert err.indices == (1,)


def test_empty_free_is_noop() -> None:
    a = TokenToKVPoolAllocator(4)
    before = a.snapshot()
    a.free([])
    assert a.snapshot() == before


def test_free_group_buffers_and_frees_once_at_end() -> None:
    a = TokenToKVPoolAllocator(6)
    a.alloc(4)
    a.free_group_begin()
    a.free([3])
    a.free([1, 2])
    snap = a.snapshot()
    assert snap.in_free_group
    assert snap.pending_free == (3, 1, 2)
    assert snap.free_pages == (5, 6)
    # Validated at buffer time against the buffer: slot 1 again is a double free.
    assert_refused(a, DoubleFreeError, lambda: a.free([1]))
    assert_refused(a, DoubleFreeError, lambda: a.free([5]))
    a.free_group_end()
    assert a.free_pages == [5, 6, 3, 1, 2]
    assert not a.snapshot().in_free_group
    assert a.snapshot().pending_free == ()


def test_free_group_misuse() -> None:
    a = TokenToKVPoolAllocator(4)
    assert_refused(a, InvalidArgumentError, a.free_group_end)
    a.free_group_begin()
    assert_refused(a, InvalidArgumentError, a.free_group_begin)
    a.free_group_end()


def test_free_group_end_fails_cleanly_after_restore() -> None:
    a = TokenToKVPoolAllocator(4)
    state = a.backup_state()
    a.alloc(1)
    a.free_group_begin()
    a.free([1])
    a.restore_state(state)  # slot 1 is free again behind the group's back
    assert_refused(a, DoubleFreeError, a.free_group_end)
    a.clear()
    assert a.snapshot().pending_free == ()
    assert not a.snapshot().in_free_group


def test_need_sort_release_pages_and_merge() -> None:
    a = TokenToKVPoolAllocator(5, need_sort=True)
    assert a.alloc(4) == [1, 2, 3, 4]
    a.free([3, 1])
    assert a.free_pages == [5]
    assert a.release_pages == [3, 1]
    assert a.available_size() == 3
    assert_none_unchanged(a, lambda: a.alloc(4))  # not even merged on failure
    assert a.alloc(1) == [5]  # enough in free_pages: no merge
    assert a.release_pages == [3, 1]
    assert a.alloc(1) == [1]  # short: merged and sorted first
    assert (a.free_pages, a.release_pages) == ([3], [])


def test_merge_and_sort_free() -> None:
    a = TokenToKVPoolAllocator(4, need_sort=True)
    a.alloc(4)
    a.free([4, 2])
    a.merge_and_sort_free()
    assert (a.free_pages, a.release_pages) == ([2, 4], [])


def test_backup_and_restore() -> None:
    a = TokenToKVPoolAllocator(4)
    a.alloc(1)
    state = a.backup_state()
    assert state == ((2, 3, 4), ())
    assert a.alloc(2) == [2, 3]
    a.restore_state(state)
    assert a.free_pages == [2, 3, 4]
    assert_refused(a, InvalidArgumentError, lambda: a.restore_state(((0,), ())))
    assert_refused(a, InvalidArgumentError, lambda: a.restore_state(((2, 2), ())))
    assert_refused(a, InvalidArgumentError, lambda: a.restore_state(((2,), (2,))))
    assert_refused(a, InvalidArgumentError, lambda: a.restore_state([2, 3]))


def test_clear() -> None:
    a = TokenToKVPoolAllocator(3, need_sort=True)
    a.alloc(3)
    a.free([2])
    a.free_group_begin()
    a.free([1])
    a.clear()
    assert a.snapshot() == TokenToKVPoolAllocator(3, need_sort=True).snapshot()


def test_alloc_extend_and_decode_at_page_size_one() -> None:
    a = TokenToKVPoolAllocator(8)
    a.alloc(1)
    out = a.alloc_extend([0, 2], [0, 2], [2, 5], [2, 5], [-1, 1], 5)
    assert out == [2, 3, 4, 5, 6]  # every token is a page: taken from the head, batch order
    assert a.alloc_decode([3, 1], [3, 1], [3, -1]) == [7, 8]
    assert_none_unchanged(a, lambda: a.alloc_decode([4], [4], [7]))


@pytest.mark.parametrize(("size", "error"), [(0, ConfigError), (-4, ConfigError)])
def test_bad_size(size: int, error: type[KVPoolError]) -> None:
    with pytest.raises(error):
        TokenToKVPoolAllocator(size)


def test_snapshot_fields() -> None:
    a = TokenToKVPoolAllocator(3, need_sort=True)
    a.alloc(1)
    snap = a.snapshot()
    assert snap.page_size == 1
    assert snap.num_pages == 3
    assert snap.size == 3
    assert snap.free_pages == (2, 3)
    assert snap.release_pages == ()
    assert snap.need_sort
    assert snap.available_size() == a.available_size() == 2

"""Unit tests of the reference ReqToTokenPool: every operation and every error path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ConfigError,
    ContextOverflowError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    KVPoolError,
    ReservedIndexError,
    RowReuseError,
)
from kvpool.reference import ReqToTokenPool
from kvpool.rules import Rules


@dataclass
class Req:
    req_pool_idx: int | None = None
    is_chunked: int = 0
    kv_committed_len: int = 0


def assert_refused(
    pool: ReqToTokenPool, error: type[KVPoolError], action: Callable[[], object]
) -> None:
    """``action`` raises ``error`` and leaves the pool (stack, generations, table) unchanged."""
    before = pool.snapshot([(r, pool.max_context_len) for r in range(1, pool.size + 1)])
    with pytest.raises(error):
        action()
    assert pool.snapshot([(r, pool.max_context_len) for r in range(1, pool.size + 1)]) == before


def test_fresh_pool_hands_out_its_last_rows_as_one_block() -> None:
    pool = ReqToTokenPool(4, 8)
    assert pool.free_slots == [1, 2, 3, 4]
    assert pool.available_size() == 4
    reqs = [Req(), Req(), Req()]
    assert pool.alloc(reqs) == [2, 3, 4]  # the tail block, in list order (SGLang 0.5.23)
    assert [r.req_pool_idx for r in reqs] == [2, 3, 4]
    assert pool.req_generation == [0, 0, 1, 1, 1]
    assert pool.free_slots == [1]


def test_fifo_rows_come_from_the_head() -> None:
    pool = ReqToTokenPool(4, 8, rules=Rules(row_order="fifo"))
    a, b, c = Req(), Req(), Req()
    assert pool.alloc([a, b]) == [1, 2]  # SGLang 0.5.16
    pool.free(a)
    assert pool.free_slots == [3, 4, 1]
    assert pool.alloc([c]) == [3]  # the freed row waits at the tail
    assert pool.req_generation == [0, 1, 1, 1, 0]


def test_free_is_lifo_and_generation_bumps_on_reuse() -> None:
    pool = ReqToTokenPool(4, 8)
    a, b = Req(), Req()
    pool.alloc([a, b])
    pool.free(a)
    assert a.req_pool_idx is None
    assert pool.free_slots == [1, 2, 3]
    c = Req()
    assert pool.alloc([c]) == [3]  # the row freed last comes back first
    assert pool.req_generation[3] == 2


def test_alloc_keeps_legal_reuse_and_mixes_batch_order() -> None:
    pool = ReqToTokenPool(4, 8)
    chunked, committed = Req(), Req()
    pool.alloc([chunked, committed])
    chunked.is_chunked = 1
    committed.kv_committed_len = 5
    new = Req()
    assert pool.alloc([new, chunked, committed]) == [2, 3, 4]
    assert pool.req_generation[1:] == [0, 1, 1, 1]  # kept rows are not bumped


def test_batch_of_only_reusing_requests_takes_no_row() -> None:
    pool = ReqToTokenPool(1, 4)
    r = Req()
    pool.alloc([r])
    r.is_chunked = 1
    assert pool.available_size() == 0
    assert pool.alloc([r]) == [1]
    assert pool.alloc([]) == []


def test_alloc_returns_none_without_change_when_short() -> None:
    pool = ReqToTokenPool(2, 4)
    pool.alloc([Req()])
    before = pool.snapshot()
    reqs = [Req(), Req()]
    assert pool.alloc(reqs) is None
    assert pool.snapshot() == before
    assert [r.req_pool_idx for r in reqs] == [None, None]


def test_illegal_reuse_raises_row_reuse_error() -> None:
    pool = ReqToTokenPool(3, 4)
    r = Req()
    pool.alloc([r])
    assert_refused(pool, RowReuseError, lambda: pool.alloc([Req(), r]))
    # A kept row that is free, or kept by two requests of one batch, is refused too.
    twin = Req(req_pool_idx=r.req_pool_idx, is_chunked=1)
    r.is_chunked = 1
    assert_refused(pool, RowReuseError, lambda: pool.alloc([r, twin]))
    assert_refused(pool, RowReuseError, lambda: pool.alloc([Req(req_pool_idx=1, is_chunked=1)]))
    assert_refused(pool, ReservedIndexError, lambda: pool.alloc([Req(RESERVED_INDEX, 1)]))
    assert_refused(pool, IndexOutOfRangeError, lambda: pool.alloc([Req(9, 1)]))


def test_free_errors() -> None:
    pool = ReqToTokenPool(3, 4)
    r = Req()
    pool.alloc([r])
    stale = Req(req_pool_idx=r.req_pool_idx)
    pool.free(r)
    assert_refused(pool, DoubleFreeError, lambda: pool.free(stale))
    assert_refused(pool, InvalidArgumentError, lambda: pool.free(Req()))
    assert_refused(pool, ReservedIndexError, lambda: pool.free(Req(RESERVED_INDEX)))
    assert_refused(pool, IndexOutOfRangeError, lambda: pool.free(Req(4)))
    assert stale.req_pool_idx == 3


def test_write_and_read() -> None:
    pool = ReqToTokenPool(2, 6)
    pool.alloc([Req(), Req()])  # rows 1 and 2 held: only a held row is read or written
    pool.write((1, slice(2, 5)), [7, 8, 9])
    assert pool.read(1, 0, 6) == [0, 0, 7, 8, 9, 0]
    copy = pool.read(1, 2, 5)
    copy[0] = 99
    assert pool.read(1, 2, 3) == [7]
    pool.write((2, slice(0, 0)), [])
    assert pool.snapshot([(1, 5), (2, 1)]).rows == ((1, (0, 0, 7, 8, 9)), (2, (0,)))


@pytest.mark.parametrize(
    ("index", "values", "error"),
    [
        ((0, slice(0, 1)), [1], ReservedIndexError),
        ((3, slice(0, 1)), [1], IndexOutOfRangeError),
        ((-1, slice(0, 1)), [1], IndexOutOfRangeError),
        ((1, slice(4, 7)), [1, 2, 3], ContextOverflowError),
        ((1, slice(0, 2)), [1], InvalidArgumentError),
        ((1, slice(None, 2)), [1, 2], InvalidArgumentError),
        ((1, slice(0, None)), [1] * 6, InvalidArgumentError),
        ((1, slice(0, 4, 2)), [1, 2], InvalidArgumentError),
        ((1, slice(3, 2)), [], InvalidArgumentError),
    ],
)
def test_write_errors(
    index: tuple[int, slice], values: list[int], error: type[KVPoolError]
) -> None:
    pool = ReqToTokenPool(2, 6)
    pool.alloc([Req(), Req()])  # both rows held: only ``index`` or ``values`` is wrong
    assert_refused(pool, error, lambda: pool.write(index, values))


def test_write_needs_a_row_slice_pair() -> None:
    pool = ReqToTokenPool(2, 6)
    assert_refused(pool, InvalidArgumentError, lambda: pool.write(1, [1]))  # type: ignore[arg-type]


def test_read_and_snapshot_errors() -> None:
    pool = ReqToTokenPool(2, 6)
    pool.alloc([Req()])  # row 2 held, row 1 free
    assert_refused(pool, InvalidArgumentError, lambda: pool.read(1, 0, 1))
    pool.alloc([Req()])
    assert_refused(pool, ReservedIndexError, lambda: pool.read(RESERVED_INDEX, 0, 1))
    assert_refused(pool, ContextOverflowError, lambda: pool.read(1, 0, 7))
    assert_refused(pool, IndexOutOfRangeError, lambda: pool.snapshot([(5, 1)]))


def test_clear_frees_every_row_and_keeps_generations() -> None:
    pool = ReqToTokenPool(3, 4)
    pool.alloc([Req(), Req()])
    pool.write((2, slice(0, 2)), [5, 6])
    pool.clear()
    assert pool.free_slots == [1, 2, 3]
    assert pool.req_generation == [0, 0, 1, 1]
    assert pool.snapshot([(2, 2)]).rows == ((2, (5, 6)),)  # contents kept (a free row: no read)
    assert_refused(pool, InvalidArgumentError, lambda: pool.read(2, 0, 2))
    assert pool.alloc([Req()]) == [3]
    assert pool.req_generation[3] == 2


def test_clear_resets_generations_under_sglang_0_5_16_rules() -> None:
    pool = ReqToTokenPool(3, 4, rules=Rules(generation_on_clear="reset"))
    pool.alloc([Req(), Req()])
    pool.clear()
    assert pool.req_generation == [0, 0, 0, 0]
    assert pool.alloc([Req()]) == [3] and pool.req_generation[3] == 1


@pytest.mark.parametrize(("size", "width"), [(0, 4), (-1, 4), (2, 0), (2, -3)])
def test_bad_sizes_raise_config_error(size: int, width: int) -> None:
    with pytest.raises(ConfigError):
        ReqToTokenPool(size, width)


def test_snapshot_fields() -> None:
    pool = ReqToTokenPool(2, 3)
    pool.alloc([Req()])
    snap = pool.snapshot()
    assert snap.size == 2
    assert snap.max_context_len == 3
    assert snap.free_slots == (1,)
    assert snap.req_generation == (0, 0, 1)
    assert snap.rows == ()

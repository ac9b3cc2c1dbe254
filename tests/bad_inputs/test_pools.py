"""Bad inputs to the request tables, the KV buffers and the Mamba state pool of both twins."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from kvpool.errors import (
    ConfigError,
    ContextOverflowError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    ReservedIndexError,
    RowReuseError,
)
from tests.bad_inputs.harness import Case, Twin, fixture, modes_of, params, run_case


@dataclass
class Row:
    """A request as the table sees it."""

    req_pool_idx: int | None = None
    is_chunked: int = 0
    kv_committed_len: int = 0


# --------------------------------------------------------------------------- request tables
def table(tw: Twin) -> SimpleNamespace:
    """Two rows of 4 columns; row 2 held (by ``a``), holding slots 5, 6."""
    pool = tw.new("ReqToTokenPool", 2, 4)
    a = Row()
    assert pool.alloc([a]) == [2]
    pool.write((2, slice(0, 2)), tw.idx([5, 6]))
    return fixture(pool, a=a)


def hybrid(tw: Twin) -> SimpleNamespace:
    """Two rows, two Mamba slots; request ``r`` holds row 2 and Mamba slot 1."""
    pool = tw.new("HybridReqToTokenPool", 2, 4, 2)
    r = tw.ns.Req("r", [1, 2])
    assert pool.alloc([r]) == [2]
    return fixture(pool, r=r)


def write(row: object, start: int, stop: int, values: list[Any], step: int | None = None) -> Any:
    return lambda tw, fx: fx.target.write((row, slice(start, stop, step)), values)


def alloc_rows(*rows: Row) -> Any:
    return lambda tw, fx: fx.target.alloc(list(rows))


TABLE = [
    Case("table-keep-row-unchunked", table, lambda tw, fx: fx.target.alloc([fx.a]), RowReuseError),
    Case("table-keep-free-row", table, alloc_rows(Row(1, 1)), RowReuseError),
    Case(
        "table-keep-row-twice",
        table,
        lambda tw, fx: fx.target.alloc([Row(2, 1), Row(2, 1)]),
        RowReuseError,
    ),
    Case("table-keep-row-0", table, alloc_rows(Row(0, 1)), ReservedIndexError),
    Case("table-keep-row-past", table, alloc_rows(Row(3, 1)), IndexOutOfRangeError),
    Case("table-keep-row-float", table, alloc_rows(Row(2.0, 1)), InvalidArgumentError),  # type: ignore[arg-type]
    Case("table-alloc-too-many-rows", table, alloc_rows(Row(), Row()), None),
    Case(
        "table-alloc-same-request-twice",
        lambda tw: fixture(tw.new("ReqToTokenPool", 4, 4)),
        lambda tw, fx: fx.target.alloc([twice := Row(), twice]),
        InvalidArgumentError,
    ),
    Case("table-free-free-row", table, lambda tw, fx: fx.target.free(Row(1)), DoubleFreeError),
    Case("table-free-no-row", table, lambda tw, fx: fx.target.free(Row()), InvalidArgumentError),
    Case("table-free-row-0", table, lambda tw, fx: fx.target.free(Row(0)), ReservedIndexError),
    Case("table-write-past-context", table, write(2, 3, 5, [1, 2]), ContextOverflowError),
    Case("table-write-row-0", table, write(0, 0, 1, [1]), ReservedIndexError),
    Case("table-write-row-past", table, write(3, 0, 1, [1]), IndexOutOfRangeError),
    Case("table-write-too-few-values", table, write(2, 0, 2, [1]), InvalidArgumentError),
    Case("table-write-float-values", table, write(2, 0, 1, [1.5]), InvalidArgumentError),
    Case("table-write-negative-start", table, write(2, -1, 1, [1, 2]), InvalidArgumentError),
    Case("table-write-step-2", table, write(2, 0, 4, [1, 2], step=2), InvalidArgumentError),
    Case(
        "table-write-not-a-slice",
        table,
        lambda tw, fx: fx.target.write((2, 1), [1]),
        InvalidArgumentError,
    ),
    Case(
        "table-read-past-context",
        table,
        lambda tw, fx: fx.target.read(2, 0, 5),
        ContextOverflowError,
    ),
    Case(
        "table-read-stop-before-start",
        table,
        lambda tw, fx: fx.target.read(2, 2, 1),
        InvalidArgumentError,
    ),
    Case("table-ctor-size-0", table, lambda tw, fx: tw.new("ReqToTokenPool", 0, 4), ConfigError),
    Case(
        "table-ctor-no-columns", table, lambda tw, fx: tw.new("ReqToTokenPool", 2, 0), ConfigError
    ),
    Case(
        "hybrid-free-mamba-twice",
        hybrid,
        lambda tw, fx: fx.target.free_mamba_cache(tw.ns.Req("x", [1])),
        DoubleFreeError,
    ),
    Case(
        "hybrid-keep-bad-track-entry",
        hybrid,
        lambda tw, fx: fx.target.free_mamba_cache(fx.r, 0),
        InvalidArgumentError,
    ),
    Case(
        "hybrid-alloc-too-many-rows",
        hybrid,
        lambda tw, fx: fx.target.alloc([tw.ns.Req("x", [1]), tw.ns.Req("y", [1])]),
        None,
    ),
    Case(
        "hybrid-ctor-three-track-buffers",
        hybrid,
        lambda tw, fx: tw.new("HybridReqToTokenPool", 2, 4, 2, 1, 3),
        ConfigError,
    ),
]


# --------------------------------------------------------------------------- KV buffers
def mha(tw: Twin) -> SimpleNamespace:
    """MHA: 8 slots of page size 4 (12 rows), 1 head of dim 2, 1 layer; tags 7, 8 at 4, 5."""
    kv = tw.new("MHATokenToKVPool", 8, 4, "float32", 1, 2, 1)
    kv.write_tags(tw.idx([4, 5]), tw.idx([7, 8]))
    return fixture(kv)


def mla(tw: Twin) -> SimpleNamespace:
    """MLA: 8 slots of page size 4, kv_lora_rank 2 + rope 1, 2 layers from layer 1."""
    kv = tw.new("MLATokenToKVPool", 8, 4, 2, 1, 2, 1)
    kv.write_tags(tw.idx([4]), tw.idx([9]))
    return fixture(kv)


def set_mha(layer: int, loc: list[int], n: int = 1, dim: int = 2, floats: bool = False) -> Any:
    """``set_kv_buffer`` of ``n`` rows of width ``dim`` at ``loc``."""

    def call(tw: Twin, fx: SimpleNamespace) -> Any:
        where = tw.floats(loc) if floats else tw.idx(loc)
        return fx.target.set_kv_buffer(layer, where, tw.data((n, 1, dim)), tw.data((n, 1, dim)))

    return call


def set_mla(layer: int, loc: list[int], n: int = 1, dim: int = 3) -> Any:
    return lambda tw, fx: fx.target.set_kv_buffer(layer, tw.idx(loc), tw.data((n, 1, dim)))


KV = [
    Case("mha-set-at-minus-1", mha, set_mha(0, [-1]), IndexOutOfRangeError, host=False),
    Case("mha-set-past-rows", mha, set_mha(0, [12]), IndexOutOfRangeError, host=False),
    Case("mha-set-float-slots", mha, set_mha(0, [4], floats=True), InvalidArgumentError),
    Case("mha-set-wrong-head-dim", mha, set_mha(0, [4], dim=3), InvalidArgumentError),
    Case("mha-set-rows-for-fewer-slots", mha, set_mha(0, [4, 5], n=1), InvalidArgumentError),
    Case("mha-set-unknown-layer", mha, set_mha(1, [4]), IndexOutOfRangeError),
    Case(
        "mha-move-past-rows",
        mha,
        lambda tw, fx: fx.target.move_kv_cache(tw.idx([12]), tw.idx([4])),
        IndexOutOfRangeError,
        host=False,
    ),
    Case(
        "mha-move-mismatched",
        mha,
        lambda tw, fx: fx.target.move_kv_cache(tw.idx([6, 7]), tw.idx([4])),
        InvalidArgumentError,
    ),
    Case(
        "mha-write-tags-count",
        mha,
        lambda tw, fx: fx.target.write_tags(tw.idx([6, 7]), tw.idx([3])),
        InvalidArgumentError,
    ),
    Case(
        "mha-write-tags-at-minus-1",
        mha,
        lambda tw, fx: fx.target.write_tags(tw.idx([-1]), tw.idx([3])),
        IndexOutOfRangeError,
        host=False,
    ),
    Case(
        "mha-read-tags-past-rows",
        mha,
        lambda tw, fx: fx.target.read_tags(tw.idx([12])),
        IndexOutOfRangeError,
        host=False,
    ),
    Case(
        "mha-get-unknown-layer",
        mha,
        lambda tw, fx: fx.target.get_key_buffer(3),
        IndexOutOfRangeError,
    ),
    Case(
        "mha-ctor-unknown-dtype",
        mha,
        lambda tw, fx: tw.new("MHATokenToKVPool", 8, 4, "int7", 1, 2, 1),
        ConfigError,
    ),
    Case(
        "mha-ctor-size-0",
        mha,
        lambda tw, fx: tw.new("MHATokenToKVPool", 0, 4, "float32", 1, 2, 1),
        ConfigError,
    ),
    Case("mla-set-at-minus-1", mla, set_mla(1, [-1]), IndexOutOfRangeError, host=False),
    Case("mla-set-layer-before-start", mla, set_mla(0, [4]), IndexOutOfRangeError),
    Case("mla-set-wrong-width", mla, set_mla(1, [4], dim=2), InvalidArgumentError),
    Case(
        "mla-ctor-rank-0",
        mla,
        lambda tw, fx: tw.new("MLATokenToKVPool", 8, 4, 0, 1, 2),
        ConfigError,
    ),
]


# --------------------------------------------------------------------------- SWA KV and Mamba
def swa_kv(tw: Twin) -> SimpleNamespace:
    """Full 16 and SWA 8 slots of page size 4; layer 0 full, layer 1 sliding-window; a
    6-token request's full slots tagged."""
    alloc = tw.new("SWATokenToKVPoolAllocator", 16, 8, 4)
    kv = tw.new("SWAKVPool", 16, 8, 4, "float32", 1, 2, [1], [0])
    kv.register_mapping(alloc.full_to_swa_index_mapping)
    got = alloc.alloc_extend(tw.idx([0]), [0], tw.idx([6]), [6], tw.idx([-1]), 6)
    kv.write_tags(got, tw.idx(range(1, 7)))
    return fixture(kv)


def mamba_pool(tw: Twin) -> SimpleNamespace:
    """Four Mamba slots, one layer; slots 1 and 2 hold states 5 and 6."""
    pool = tw.new("MambaPool", 4)
    pool.write_state([1, 2], [5, 6])
    return fixture(pool)


SWA_AND_MAMBA = [
    Case("swa-kv-unknown-layer", swa_kv, set_mha(2, [4]), IndexOutOfRangeError),
    Case(
        "swa-kv-translate-floats",
        swa_kv,
        lambda tw, fx: fx.target.translate_loc_from_full_to_swa(tw.floats([4])),
        InvalidArgumentError,
    ),
    Case(
        "swa-kv-translate-past-pool",
        swa_kv,
        lambda tw, fx: fx.target.translate_loc_from_full_to_swa(tw.idx([40])),
        IndexOutOfRangeError,
        host=False,
    ),
    Case(
        "swa-kv-set-full-layer-at-minus-1",
        swa_kv,
        set_mha(0, [-1]),
        IndexOutOfRangeError,
        host=False,
    ),
    Case(
        "swa-kv-ctor-shared-layer",
        swa_kv,
        lambda tw, fx: tw.new("SWAKVPool", 16, 8, 4, "float32", 1, 2, [0], [0]),
        ConfigError,
    ),
    Case(
        "mamba-pool-clear-slot-0",
        mamba_pool,
        lambda tw, fx: fx.target.clear_slots([0]),
        ReservedIndexError,
    ),
    Case(
        "mamba-pool-clear-past",
        mamba_pool,
        lambda tw, fx: fx.target.clear_slots([5]),
        IndexOutOfRangeError,
    ),
    Case(
        "mamba-pool-clear-slot-0-tensor",
        mamba_pool,
        lambda tw, fx: fx.target.clear_slots(tw.idx([0])),
        ReservedIndexError,
        host=False,
    ),
    Case(
        "mamba-pool-clear-floats",
        mamba_pool,
        lambda tw, fx: fx.target.clear_slots(tw.floats([1])),
        InvalidArgumentError,
    ),
    Case(
        "mamba-pool-copy-mismatched",
        mamba_pool,
        lambda tw, fx: fx.target.copy_from([1, 2], [3]),
        InvalidArgumentError,
    ),
    Case(
        "mamba-pool-copy-onto-source",
        mamba_pool,
        lambda tw, fx: fx.target.copy_from([1], [1]),
        InvalidArgumentError,
    ),
    Case(
        "mamba-pool-write-too-few-tags",
        mamba_pool,
        lambda tw, fx: fx.target.write_state([3, 4], [1]),
        InvalidArgumentError,
    ),
    Case(
        "mamba-pool-write-repeated-slots",
        mamba_pool,
        lambda tw, fx: fx.target.write_state([3, 3], [1, 2]),
        InvalidArgumentError,
    ),
    Case(
        "mamba-pool-write-float-tags",
        mamba_pool,
        lambda tw, fx: fx.target.write_state([3], [1.5]),
        InvalidArgumentError,
    ),
    Case("mamba-pool-ctor-size-0", mamba_pool, lambda tw, fx: tw.new("MambaPool", 0), ConfigError),
]

CASES = [*TABLE, *KV, *SWA_AND_MAMBA]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input_is_refused_identically(case: Case) -> None:
    run_case(case, modes_of(case))

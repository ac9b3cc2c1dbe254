"""alloc_extend and alloc_decode on every CPU backend against the pure reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from kvpool.kernels import alloc_decode, alloc_extend
from kvpool.kernels.dispatch import triton_installed
from kvpool.reference.pools.paged_ops import alloc_decode_slots, alloc_extend_slots
from tests.kernels.strategies import (
    SENTINEL,
    DecodeBatch,
    ExtendBatch,
    decode_batches,
    extend_batches,
    scaled_examples,
)

FAST_BACKENDS = ["python", "torch"]
needs_triton = pytest.mark.skipif(not triton_installed(), reason="triton is not installed")
LEN_DTYPES = (torch.int64, torch.int32)


def _t(values: list[int] | list[list[int]], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def run_extend(batch: ExtendBatch, backend: str, len_dtype: torch.dtype = torch.int64) -> None:
    expected = alloc_extend_slots(
        batch.prefix_lens, batch.seq_lens, batch.last_loc, batch.free_pages, batch.page_size
    )
    out = torch.full((batch.num_tokens,), SENTINEL, dtype=torch.int64)
    free = _t(batch.free_pages)
    alloc_extend(
        _t(batch.prefix_lens, len_dtype),
        _t(batch.seq_lens, len_dtype),
        _t(batch.last_loc),
        free,
        out,
        batch.page_size,
        backend=backend,
    )
    assert out.tolist() == expected
    assert free.tolist() == batch.free_pages  # the kernel only reads the free list


def run_decode(batch: DecodeBatch, backend: str, len_dtype: torch.dtype = torch.int64) -> None:
    expected = alloc_decode_slots(batch.seq_lens, batch.last_loc, batch.free_pages, batch.page_size)
    out = torch.full((len(batch.seq_lens),), SENTINEL, dtype=torch.int64)
    alloc_decode(
        _t(batch.seq_lens, len_dtype),
        _t(batch.last_loc),
        _t(batch.free_pages),
        out,
        batch.page_size,
        backend=backend,
    )
    assert out.tolist() == expected


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@given(batch=extend_batches())
def test_alloc_extend_matches_reference(backend: str, batch: ExtendBatch) -> None:
    run_extend(batch, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", FAST_BACKENDS)
@settings(max_examples=scaled_examples(3))
@given(batch=extend_batches(max_bs=64, max_len=3000))
def test_alloc_extend_large_batches_and_long_extends(backend: str, batch: ExtendBatch) -> None:
    run_extend(batch, backend, LEN_DTYPES[batch.page_size % 2])


@pytest.mark.slow
@pytest.mark.parametrize("backend", FAST_BACKENDS)
@given(batch=decode_batches())
def test_alloc_decode_matches_reference(backend: str, batch: DecodeBatch) -> None:
    run_decode(batch, backend, LEN_DTYPES[len(batch.seq_lens) % 2])


@needs_triton
@settings(max_examples=scaled_examples(2))
@given(batch=extend_batches(max_bs=4, max_len=80))
def test_alloc_extend_interpreter(batch: ExtendBatch) -> None:
    run_extend(batch, "interpret", LEN_DTYPES[batch.page_size % 2])


@pytest.mark.slow
@needs_triton
@settings(max_examples=scaled_examples(2))
@given(batch=decode_batches(max_bs=200))
def test_alloc_decode_interpreter(batch: DecodeBatch) -> None:
    run_decode(batch, "interpret")


@pytest.mark.parametrize("backend", [*FAST_BACKENDS, pytest.param("interpret", marks=needs_triton)])
def test_alloc_extend_worked_example(backend: str) -> None:
    # specs/sglang_behaviour.md, section 4: ps 4, free_pages [9, 3, 7], P 6, last_loc 25, S 15.
    batch = ExtendBatch(4, [6], [15], [25], [9, 3, 7])
    out = torch.zeros(9, dtype=torch.int64)
    alloc_extend(_t([6]), _t([15]), _t([25]), _t([9, 3, 7]), out, 4, backend=backend)
    assert out.tolist() == [26, 27, 36, 37, 38, 39, 12, 13, 14]
    run_extend(batch, backend)


@pytest.mark.parametrize("backend", [*FAST_BACKENDS, pytest.param("interpret", marks=needs_triton)])
@pytest.mark.parametrize("page_size", [1, 2, 4, 16, 64])
def test_alloc_extend_edges_in_one_batch(backend: str, page_size: int) -> None:
    ps = page_size
    # empty prefix; prefix ending mid-page extended inside its page; exact boundaries;
    # zero-length extend; a long extend of thousands of tokens.
    prefix = [0, ps + ps // 2, 2 * ps, 3 * ps, ps + ps // 2, 1]
    seq = [ps + 1, ps + ps // 2 + (ps - ps // 2) // 2, 4 * ps, 3 * ps, 3000, 1]
    loc = [-1 if p == 0 else 7 * ps + (p - 1) % ps for p in prefix]
    needed = sum(-(-s // ps) - (-(-p // ps)) for p, s in zip(prefix, seq, strict=True))
    free = list(range(needed + 5, 4, -1))
    run_extend(ExtendBatch(ps, prefix, seq, loc, free), backend)


@pytest.mark.parametrize("backend", [*FAST_BACKENDS, pytest.param("interpret", marks=needs_triton)])
def test_alloc_decode_worked_example(backend: str) -> None:
    # ps 4: S - 1 = 4 and 8 open pages (taking 8 then 2); the others continue after last_loc.
    out = torch.zeros(4, dtype=torch.int64)
    alloc_decode(_t([5, 7, 9, 2]), _t([10, 20, 30, 40]), _t([8, 2]), out, 4, backend=backend)
    assert out.tolist() == [32, 21, 8, 41]


@pytest.mark.parametrize("backend", [*FAST_BACKENDS, pytest.param("interpret", marks=needs_triton)])
def test_alloc_with_no_free_pages_and_empty_batches(backend: str) -> None:
    # Nothing opens a page, so an empty free list must be fine; empty batches do nothing.
    out = torch.zeros(2, dtype=torch.int64)
    alloc_extend(_t([5]), _t([7]), _t([20]), _t([]), out, 4, backend=backend)
    assert out.tolist() == [21, 22]
    alloc_decode(_t([7]), _t([21]), _t([]), out[:1], 4, backend=backend)
    assert out.tolist() == [22, 22]
    empty = torch.zeros(0, dtype=torch.int64)
    alloc_extend(empty, empty, empty, _t([3]), empty, 4, backend=backend)
    alloc_decode(empty, empty, _t([3]), empty, 4, backend=backend)

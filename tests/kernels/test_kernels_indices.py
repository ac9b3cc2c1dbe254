"""The FlashInfer CSR and FlashMLA block-table builders on every CPU backend."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.constants import ceil_div
from kvpool.kernels import (
    create_flashinfer_kv_indices,
    create_flashmla_kv_indices,
    create_flashmla_kv_indices_v2p,
)
from kvpool.kernels.dispatch import triton_installed
from kvpool.kernels.flashinfer_indices import flashinfer_kv_indices_ref
from kvpool.kernels.flashmla_indices import flashmla_kv_indices_ref
from tests.kernels.strategies import SENTINEL, TableBatch, scaled_examples, table_batches

needs_triton = pytest.mark.skipif(not triton_installed(), reason="triton is not installed")
ALL_BACKENDS = ["python", "torch", pytest.param("interpret", marks=needs_triton)]


def _t(values: list[int] | list[list[int]], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def run_flashinfer(batch: TableBatch, with_start: bool, backend: str) -> None:
    indptr = [0, *itertools.accumulate(batch.lens)]
    starts = batch.starts if with_start else None
    expected = [SENTINEL] * (indptr[-1] + 5)  # the tail past the batch must stay untouched
    flashinfer_kv_indices_ref(batch.table, batch.rows, batch.lens, indptr, starts, expected)
    kv_indices = _t(expected, torch.int32).fill_(SENTINEL)
    create_flashinfer_kv_indices(
        _t(batch.table, torch.int32),
        _t(batch.rows),
        _t(batch.lens, torch.int32),
        _t(indptr, torch.int32),
        None if starts is None else _t(starts),
        kv_indices,
        backend=backend,
    )
    assert kv_indices.tolist() == expected


def run_flashmla(batch: TableBatch, with_start: bool, backend: str) -> None:
    ps = batch.page_size
    starts = batch.starts if with_start else None
    max_pages = max(ceil_div(n, ps) for n in batch.lens) + 2
    expected = [[SENTINEL] * max_pages for _ in batch.rows]
    flashmla_kv_indices_ref(batch.table, batch.rows, batch.lens, starts, expected, ps)
    kv_indices = torch.full((len(batch.rows), max_pages), SENTINEL, dtype=torch.int32)
    create_flashmla_kv_indices(
        _t(batch.table, torch.int32),
        _t(batch.rows),
        _t(batch.lens, torch.int32),
        None if starts is None else _t(starts),
        kv_indices,
        ps,
        backend=backend,
    )
    assert kv_indices.tolist() == expected


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["python", "torch"])
@given(batch=table_batches(max_bs=24), with_start=st.booleans())
def test_flashinfer_matches_reference(backend: str, batch: TableBatch, with_start: bool) -> None:
    run_flashinfer(batch, with_start, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["python", "torch"])
@given(batch=table_batches(max_bs=24), with_start=st.booleans())
def test_flashmla_matches_reference(backend: str, batch: TableBatch, with_start: bool) -> None:
    run_flashmla(batch, with_start, backend)


@needs_triton
@settings(max_examples=scaled_examples(2))
@given(batch=table_batches(max_bs=4), with_start=st.booleans())
def test_flashinfer_interpreter(batch: TableBatch, with_start: bool) -> None:
    run_flashinfer(batch, with_start, "interpret")


@needs_triton
@settings(max_examples=scaled_examples(2))
@given(batch=table_batches(max_bs=4), with_start=st.booleans())
def test_flashmla_interpreter(batch: TableBatch, with_start: bool) -> None:
    run_flashmla(batch, with_start, "interpret")


def _example_table() -> torch.Tensor:
    # Row 2 holds a request on pages 9 and 3 (ps 4): 36..39 then 12, 13, 14.
    table = torch.zeros(4, 8, dtype=torch.int32)
    table[2, :7] = _t([36, 37, 38, 39, 12, 13, 14], torch.int32)
    table[1, :3] = _t([20, 21, 22], torch.int32)
    return table


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_flashinfer_worked_example(backend: str) -> None:
    table = _example_table()
    out = torch.full((12,), SENTINEL, dtype=torch.int32)
    lens, indptr = _t([7, 3]), _t([0, 7, 10])
    create_flashinfer_kv_indices(table, _t([2, 1]), lens, indptr, None, out, backend=backend)
    assert out.tolist() == [36, 37, 38, 39, 12, 13, 14, 20, 21, 22, SENTINEL, SENTINEL]
    # With kv_start_idx: request 0 skips its first page, request 1 its first token.
    out.fill_(SENTINEL)
    lens, indptr, start = _t([3, 2]), _t([0, 3, 5]), _t([4, 1])
    create_flashinfer_kv_indices(table, _t([2, 1]), lens, indptr, start, out, backend=backend)
    assert out.tolist()[:6] == [12, 13, 14, 21, 22, SENTINEL]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_flashmla_worked_example(backend: str) -> None:
    table = _example_table()
    out = torch.full((2, 3), SENTINEL, dtype=torch.int32)
    create_flashmla_kv_indices(table, _t([2, 2]), _t([7, 4]), None, out, 4, backend=backend)
    assert out.tolist() == [[9, 3, SENTINEL], [9, SENTINEL, SENTINEL]]
    # Page size 1: the block table is the row itself; a start skips columns.
    out = torch.full((1, 4), SENTINEL, dtype=torch.int32)
    create_flashmla_kv_indices(table, _t([2]), _t([3]), _t([4]), out, 1, backend=backend)
    assert out.tolist() == [[12, 13, 14, SENTINEL]]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_flashmla_v2p_worked_example(backend: str) -> None:
    table = _example_table()  # row 2: slots 36..39 (virtual page 9), 12..14 (virtual page 3)
    v2p = torch.full((16,), -1, dtype=torch.int64)
    v2p[0], v2p[9] = 0, 5  # virtual page 9 lives in physical page 5; page 3 is freed
    out = torch.full((2, 3), SENTINEL, dtype=torch.int32)
    create_flashmla_kv_indices(
        table, _t([2, 2]), _t([7, 4]), None, out, 4, backend=backend, v2p=v2p
    )
    assert out.tolist() == [[5, 0, SENTINEL], [5, SENTINEL, SENTINEL]]  # freed -> padding 0
    table[2, 0] = -1  # a -1 slot reads entry 0 (the reserved page), not v2p[-1]
    v2p[0] = 0
    create_flashmla_kv_indices_v2p(table, _t([2]), _t([1]), None, out, 4, v2p, backend)
    assert out.tolist()[0][0] == 0

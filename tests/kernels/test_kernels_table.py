"""write_req_to_token and get_last_loc on every CPU backend against their pure references."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.constants import NO_LAST_LOC
from kvpool.kernels import get_last_loc, write_req_to_token
from kvpool.kernels.dispatch import triton_installed
from kvpool.kernels.last_loc import get_last_loc_ref
from kvpool.kernels.write_req_to_token import write_req_to_token_ref
from tests.kernels.strategies import TableBatch, scaled_examples, table_batches

needs_triton = pytest.mark.skipif(not triton_installed(), reason="triton is not installed")
ALL_BACKENDS = ["python", "torch", pytest.param("interpret", marks=needs_triton)]


def _t(values: list[int] | list[list[int]], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def run_write(batch: TableBatch, seed: int, backend: str) -> None:
    """Use ``starts`` as prefix lengths and ``starts + lens`` as sequence lengths."""
    rng = random.Random(seed)
    prefix_lens = batch.starts
    seq_lens = [p + n for p, n in zip(batch.starts, batch.lens, strict=True)]
    prefix_slots = [rng.randrange(1, 2**31 - 1) for _ in range(sum(prefix_lens))]
    new_slots = [rng.randrange(1, 2**31 - 1) for _ in range(sum(batch.lens))]
    expected = [list(row) for row in batch.table]
    write_req_to_token_ref(expected, batch.rows, prefix_slots, prefix_lens, seq_lens, new_slots)
    table = _t(batch.table, torch.int32)
    write_req_to_token(
        table,
        _t(batch.rows),
        _t(prefix_slots),
        _t(prefix_lens, torch.int32 if seed % 2 else torch.int64),
        _t(seq_lens),
        _t(new_slots),
        backend=backend,
    )
    assert table.tolist() == expected


def run_last_loc(batch: TableBatch, backend: str) -> None:
    expected = get_last_loc_ref(batch.table, batch.rows, batch.lens)
    got = get_last_loc(_t(batch.table, torch.int32), _t(batch.rows), _t(batch.lens), backend)
    assert got.dtype == torch.int64
    assert got.tolist() == expected


@pytest.mark.parametrize("backend", ["python", "torch"])
@given(batch=table_batches(max_bs=16), seed=st.integers(0, 2**16))
def test_write_req_to_token_matches_reference(backend: str, batch: TableBatch, seed: int) -> None:
    run_write(batch, seed, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["python", "torch"])
@given(batch=table_batches(max_bs=32, with_starts=False))
def test_get_last_loc_matches_reference(backend: str, batch: TableBatch) -> None:
    run_last_loc(batch, backend)


@needs_triton
@settings(max_examples=scaled_examples(2))
@given(batch=table_batches(max_bs=4), seed=st.integers(0, 2**16))
def test_write_req_to_token_interpreter(batch: TableBatch, seed: int) -> None:
    run_write(batch, seed, "interpret")


@pytest.mark.slow
@needs_triton
@settings(max_examples=scaled_examples(2))
@given(batch=table_batches(max_bs=200, max_cols=64, with_starts=False))
def test_get_last_loc_interpreter(batch: TableBatch) -> None:
    run_last_loc(batch, "interpret")


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_write_req_to_token_worked_example(backend: str) -> None:
    table = torch.zeros(4, 8, dtype=torch.int32)
    write_req_to_token(
        table,
        _t([2, 1]),
        _t([5, 6, 7]),  # request 0 has no prefix; request 1's prefix is 5, 6, 7
        _t([0, 3]),
        _t([2, 5]),
        _t([50, 51, 60, 61]),
        backend=backend,
    )
    assert table[2].tolist() == [50, 51, 0, 0, 0, 0, 0, 0]
    assert table[1].tolist() == [5, 6, 7, 60, 61, 0, 0, 0]
    assert table[0].tolist() == [0] * 8 and table[3].tolist() == [0] * 8


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_get_last_loc_worked_example(backend: str) -> None:
    table = torch.zeros(4, 8, dtype=torch.int32)
    table[3, :5] = _t([36, 37, 38, 39, 12], torch.int32)
    got = get_last_loc(table, _t([3, 3, 1]), _t([5, 4, 0]), backend=backend)
    assert got.tolist() == [12, 39, NO_LAST_LOC]
    assert get_last_loc(table, _t([]), _t([]), backend=backend).tolist() == []

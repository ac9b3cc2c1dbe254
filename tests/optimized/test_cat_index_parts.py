"""The twin's concatenation of many index parts (:func:`cat_index_parts`), below autograd.

A free group's end joins one part per buffered free (1,024 in the lifecycle's batch release).
From :data:`PARTS_BELOW_AUTOGRAD` parts on, the join runs under torch's guard that dispatches
below the autograd layer. Checked here:

- the join equals ``torch.cat`` of the parts, and the result is an ordinary tensor (not an
  inference tensor: its holder writes it in place later);
- the guard is entered from the threshold on, and not below it;
- a torch without the guard (a no-op context instead) gives the same join;
- free groups of 1,024 frees and ``need_sort`` staging of many frees, on both page sizes and in
  both modes, leave the twin's lists equal to the reference's.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools import free_list
from kvpool.optimized.pools.free_list import cat_index_parts
from kvpool.optimized.pools.paged_allocator import PagedTokenToKVPoolAllocator as TwinPaged
from kvpool.optimized.pools.token_allocator import TokenToKVPoolAllocator as TwinToken
from kvpool.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator as RefPaged
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator as RefToken

THRESHOLD = free_list.PARTS_BELOW_AUTOGRAD


def _parts(n: int, seed: int) -> list[torch.Tensor]:
    """``n`` int64 parts of 0-9 entries: own tensors, strided views and offset views."""
    rng = random.Random(seed)
    big = torch.arange(20 * n + 20, dtype=torch.int64)
    out = []
    for i in range(n):
        k = rng.randrange(10)
        how = rng.randrange(3)
        if how == 0:
            out.append(torch.tensor([rng.randrange(1000) for _ in range(k)], dtype=torch.int64))
        elif how == 1:
            out.append(big[i : i + 2 * k : 2])
        else:
            out.append(big[10 * i : 10 * i + k])
    return out


@contextlib.contextmanager
def _counting(entered: list[int]) -> Iterator[None]:
    entered.append(1)
    yield


@pytest.mark.parametrize("n", [2, THRESHOLD - 1, THRESHOLD, 1024])
def test_the_join_is_torch_cat(n: int) -> None:
    parts = _parts(n, seed=n)
    got = cat_index_parts(parts)
    assert got.tolist() == torch.cat(parts).tolist()
    assert got.dtype is torch.int64 and got.ndim == 1
    assert not got.is_inference()
    got.add_(1)  # an ordinary tensor: written in place outside any mode
    assert got.tolist() == [v + 1 for v in torch.cat(parts).tolist()]


def test_the_guard_is_entered_from_the_threshold_on(monkeypatch: pytest.MonkeyPatch) -> None:
    entered: list[int] = []
    monkeypatch.setattr(free_list, "_BELOW_AUTOGRAD", lambda: _counting(entered))
    cat_index_parts(_parts(THRESHOLD - 1, seed=1))
    assert entered == []
    cat_index_parts(_parts(THRESHOLD, seed=2))
    assert entered == [1]
    cat_index_parts(tuple(_parts(1024, seed=3)))
    assert entered == [1, 1]


def test_torch_has_the_guard() -> None:
    # Where torch lacks it the join still works (next test), only slower: say so here.
    assert free_list._BELOW_AUTOGRAD is not contextlib.nullcontext


def test_without_the_guard_the_join_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = _parts(1024, seed=4)
    want = cat_index_parts(parts).tolist()
    monkeypatch.setattr(free_list, "_BELOW_AUTOGRAD", contextlib.nullcontext)
    assert cat_index_parts(parts).tolist() == want


def _pair(page_size: int, need_sort: bool, checked: bool) -> tuple[Any, Any]:
    size = 4096 * page_size
    options = TwinOptions.make("cpu", checked=checked)
    if page_size == 1:
        return RefToken(size, need_sort), TwinToken(size, need_sort, options=options)
    return (
        RefPaged(size, page_size, need_sort),
        TwinPaged(size, page_size, need_sort, options=options),
    )


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_many_frees_match_the_reference(page_size: int, need_sort: bool, checked: bool) -> None:
    """1,024 allocations (1-3 pages each, page size 16: partly filled pages) freed in one
    group, in shuffled order; then 200 more freed one by one (``need_sort``: staged)."""
    rng = random.Random(page_size * 4 + need_sort * 2 + checked)
    ref, twin = _pair(page_size, need_sort, checked)
    blocks: list[list[int]] = []
    for _ in range(1224):
        n = rng.randrange(1, 4) * page_size
        want, got = ref.alloc(n), twin.alloc(n)
        assert got is not None and got.tolist() == want
        keep = n if page_size == 1 else n - rng.randrange(page_size)
        blocks.append(want[:keep])
    rng.shuffle(blocks)
    ref.free_group_begin()
    twin.free_group_begin()
    for b in blocks[:1024]:
        ref.free(b)
        twin.free(torch.tensor(b, dtype=torch.int64))
    ref.free_group_end()
    twin.free_group_end()
    assert twin.snapshot() == ref.snapshot()
    for b in blocks[1024:]:
        ref.free(b)
        twin.free(torch.tensor(b, dtype=torch.int64))
    assert twin.snapshot() == ref.snapshot()
    n = 2048 * page_size
    want, got = ref.alloc(n), twin.alloc(n)  # a merge first, under need_sort
    assert (None if got is None else got.tolist()) == want
    assert twin.snapshot() == ref.snapshot()

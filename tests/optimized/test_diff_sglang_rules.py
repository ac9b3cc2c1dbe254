"""SGLang 0.5.16's observable allocator choices, asserted on both twins with the same calls:
the ``need_sort`` merge pre-tests (made on the lengths before anything is taken), the no-op
merge, and the :class:`~kvpool.rules.Rules` knobs that select SGLang's lenient behaviour."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvpool import reference as ref
from kvpool.errors import AlignmentError
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools import paged_allocator as opt_paged
from kvpool.optimized.pools import token_allocator as opt_token
from kvpool.rules import Rules

CHECKED = TwinOptions.make(checked=True)

TWINS = ("reference", "optimized")


def paged(twin: str, num_pages: int, ps: int, need_sort: bool, rules: Rules | None = None) -> Any:
    if twin == "reference":
        return ref.PagedTokenToKVPoolAllocator(num_pages * ps, ps, need_sort, rules=rules)
    return opt_paged.PagedTokenToKVPoolAllocator(
        num_pages * ps, ps, need_sort, options=CHECKED, rules=rules
    )


def token(twin: str, size: int, need_sort: bool, rules: Rules | None = None) -> Any:
    if twin == "reference":
        return ref.TokenToKVPoolAllocator(size, need_sort, rules=rules)
    return opt_token.TokenToKVPoolAllocator(size, need_sort, options=CHECKED, rules=rules)


def lists(alloc: Any) -> tuple[list[int], list[int]]:
    snap = alloc.snapshot()
    return list(snap.free_pages), list(snap.release_pages)


def extend(alloc: Any, prefix: list[int], seq: list[int], last: list[int]) -> list[int] | None:
    num = sum(s - p for p, s in zip(prefix, seq, strict=True))
    if isinstance(alloc, ref.BaseTokenToKVPoolAllocator):
        return alloc.alloc_extend(prefix, prefix, seq, seq, last, num)
    out = alloc.alloc_extend(
        torch.tensor(prefix), prefix, torch.tensor(seq), seq, torch.tensor(last), num
    )
    return None if out is None else list(out.tolist())


def decode(alloc: Any, seq: list[int], last: list[int]) -> list[int] | None:
    if isinstance(alloc, ref.BaseTokenToKVPoolAllocator):
        return alloc.alloc_decode(seq, seq, last)
    out = alloc.alloc_decode(torch.tensor(seq), seq, torch.tensor(last))
    return None if out is None else list(out.tolist())


def slots(alloc: Any, n: int) -> list[int]:
    got = alloc.alloc(n)
    assert got is not None
    return list(got.tolist()) if isinstance(got, torch.Tensor) else list(got)


def free(alloc: Any, values: list[int]) -> None:
    if isinstance(alloc, ref.BaseTokenToKVPoolAllocator):
        alloc.free(values)
    else:
        alloc.free(torch.tensor(values, dtype=torch.int64))


def short_paged(twin: str, rules: Rules | None = None) -> Any:
    """ps 4, 8 pages, need_sort: pages 1..6 taken, then pages 1 and 2 freed, so
    ``free_pages == [7, 8]`` and ``release_pages == [1, 2]``; pages 3..6 stay held."""
    a = paged(twin, 8, 4, True, rules)
    held = slots(a, 24)
    free(a, held[:8])
    assert lists(a) == ([7, 8], [1, 2])
    return a


@pytest.mark.parametrize("twin", TWINS)
def test_alloc_extend_merges_on_sglang_bound(twin: str) -> None:
    """One page is needed and two are free, but ``4 // 4 + 1 + 1 = 3 > 2``: SGLang merges first
    and hands out page 1 (merging only when short would hand out page 7)."""
    a = short_paged(twin)
    assert extend(a, [0], [4], [-1]) == [4, 5, 6, 7]
    assert lists(a) == ([2, 7, 8], [])


@pytest.mark.parametrize("twin", TWINS)
def test_alloc_decode_merges_when_batch_exceeds_free_pages(twin: str) -> None:
    """Three requests need no new page, yet ``3 > len(free_pages) == 2``: SGLang merges."""
    a = short_paged(twin)
    # Requests holding 1 token of pages 3, 4, 5 (slots 12, 16, 20): their 2nd token stays put.
    assert decode(a, [2, 2, 2], [12, 16, 20]) == [13, 17, 21]
    assert lists(a) == ([1, 2, 7, 8], [])


@pytest.mark.parametrize("twin", TWINS)
def test_alloc_does_not_merge_when_it_fits(twin: str) -> None:
    a = short_paged(twin)
    assert slots(a, 8) == [28, 29, 30, 31, 32, 33, 34, 35]  # pages 7, 8; release untouched
    assert lists(a) == ([], [1, 2])


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("unchanged", [True, False])
def test_refused_alloc_keeps_or_drops_the_merge(twin: str, unchanged: bool) -> None:
    """Five pages wanted, four free in all (two free, two released): refused either way; under
    SGLang's rules the merge its pre-test made stays."""
    a = short_paged(twin, Rules(refused_alloc_unchanged=unchanged))
    assert a.alloc(5 * 4) is None
    assert lists(a) == (([7, 8], [1, 2]) if unchanged else ([1, 2, 7, 8], []))


@pytest.mark.parametrize("twin", TWINS)
def test_merge_without_release_pages_is_a_no_op(twin: str) -> None:
    a = paged(twin, 4, 2, False)
    held = slots(a, 4)  # pages 1, 2
    free(a, held[:2])
    free(a, held[2:])  # page 2 goes in front of page 1
    assert lists(a) == ([2, 1, 3, 4], [])
    a.merge_and_sort_free()
    assert lists(a) == ([2, 1, 3, 4], [])  # SGLang sorts only when it merges something


@pytest.mark.parametrize("twin", TWINS)
def test_unaligned_paged_alloc_floors_under_sglang_rules(twin: str) -> None:
    strict = paged(twin, 4, 4, False)
    with pytest.raises(AlignmentError):
        strict.alloc(6)
    lenient = paged(twin, 4, 4, False, Rules(unaligned_paged_alloc="floor"))
    assert slots(lenient, 6) == [4, 5, 6, 7]  # 6 // 4 = 1 page
    assert lenient.alloc(3) is not None and lists(lenient)[0] == [2, 3, 4]  # 0 pages


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize(("order", "expected"), [("prepend", [3, 1]), ("append", [1, 3])])
def test_release_order(twin: str, order: str, expected: list[int]) -> None:
    a = paged(twin, 4, 2, True, Rules(release_order=order))
    held = slots(a, 6)  # pages 1, 2, 3
    free(a, held[:2])
    free(a, held[4:])
    assert lists(a) == ([4], expected)


@pytest.mark.parametrize("twin", TWINS)
def test_token_extend_uses_allocs_pre_test(twin: str) -> None:
    """Page size 1: SGLang allocates an extend with ``alloc(extend_num_tokens)``, so 2 tokens
    with 2 free slots do not merge (the paged bound ``2 + 1 + 1`` would)."""
    a = token(twin, 6, True)
    held = slots(a, 4)
    free(a, held[:2])
    assert lists(a) == ([5, 6], [1, 2])
    assert extend(a, [0], [2], [-1]) == [5, 6]
    assert lists(a) == ([], [1, 2])

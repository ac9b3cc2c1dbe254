"""SGLang 0.5.23's segment frees in both twins: ``free_page_ids`` keeps the given page order,
``free_segment`` frees one page per ``page_size`` slots, misuse raises before any change, and
``Rules.tree_free = "segment"`` makes the radix cache free evicted nodes that way."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import AlignmentError, DoubleFreeError, IndexOutOfRangeError
from kvpool.rules import Rules
from kvpool.testing.implementations import optimized_implementation, reference_implementation

TWINS = [reference_implementation, optimized_implementation]


def _pages(alloc: Any, *pages: int) -> Any:
    ps = alloc.page_size
    return [p * ps + i for p in pages for i in range(ps)]


@pytest.mark.parametrize("make", TWINS)
@pytest.mark.parametrize("need_sort", [False, True])
def test_free_segment_keeps_slot_order(make: Any, need_sort: bool) -> None:
    impl = make()
    config = PoolConfig(size=32, page_size=4, need_sort=need_sort)
    alloc = impl.allocator(config)
    got = alloc.alloc(16)  # pages 1, 2, 3, 4
    assert list(got[::4]) == [4, 8, 12, 16]
    alloc.free_segment(impl.index(_pages(alloc, 3, 1)), 0)
    snap = alloc.snapshot()
    head = snap.release_pages if need_sort else snap.free_pages
    assert list(head[:2]) == [3, 1]  # as given; free() would have sorted them to [1, 3]
    alloc.free_page_ids(impl.index([4, 2]))
    snap = alloc.snapshot()
    assert list((snap.release_pages if need_sort else snap.free_pages)[:2]) == [4, 2]


@pytest.mark.parametrize("make", TWINS)
def test_segment_misuse_raises_before_any_change(make: Any) -> None:
    impl = make()
    alloc = impl.allocator(PoolConfig(size=32, page_size=4))
    alloc.alloc(16)
    before = alloc.snapshot()
    with pytest.raises(DoubleFreeError):
        alloc.free_page_ids(impl.index([2, 2]))
    with pytest.raises(AlignmentError):
        alloc.free_segment(impl.index(_pages(alloc, 1)), 2)
    with pytest.raises(IndexOutOfRangeError):
        alloc.free_page_ids(impl.index([99]))
    with pytest.raises(DoubleFreeError):
        alloc.free_page_ids(impl.index([7]))  # already free
    assert alloc.snapshot() == before


@pytest.mark.parametrize("make", TWINS)
def test_tree_free_segment_evicts_in_slot_order(make: Any) -> None:
    impl = make()
    rules = Rules(tree_free="segment")
    config = PoolConfig(size=32, page_size=4, rules=rules)
    pool, alloc = impl.req_to_token_pool(config), impl.allocator(config)
    tree = impl.radix_cache(config, pool, alloc)
    alloc.alloc(4)  # page 1 stays held
    slots = alloc.alloc(8)  # pages 2, 3
    reordered = impl.index(_pages(alloc, 3, 2))  # the node's value: page 3, then page 2
    tree.insert(impl.radix_key([1, 2, 3, 4, 5, 6, 7, 8], None), reordered)
    assert list(slots[::4]) == [8, 12]
    assert tree.evict(8) == 8
    assert list(alloc.snapshot().free_pages[:2]) == [3, 2]

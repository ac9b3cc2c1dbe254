"""The reference SWA radix cache: tombstones from a slid window, the window-bounded match, SWA
locks bounded by the window, SWA-only eviction, the early SWA release of a leaf, and tombstone
recovery (with the full part free, and while a running request locks it)."""

from __future__ import annotations

import pytest

from kvpool.errors import InvalidArgumentError, LockError
from kvpool.invariants import check_swa_allocator
from kvpool.reference.radix_key import RadixKey
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.reference.swa.radix_cache import SWARadixCache


def setup(window: int = 2) -> tuple[SWATokenToKVPoolAllocator, SWARadixCache]:
    alloc = SWATokenToKVPoolAllocator(32, 16, 1)
    return alloc, SWARadixCache(alloc, 1, window)


def check(alloc: SWATokenToKVPoolAllocator, tree: SWARadixCache) -> None:
    snap = tree.snapshot()
    pages = {s for n in snap.nodes for s in n.value}
    check_swa_allocator(alloc.snapshot(), pages, tree.swa_evictable_size_ +
                        tree.swa_protected_size_, snap)  # fmt: skip


def shape(tree: SWARadixCache) -> list[tuple[tuple[int, ...], bool, int, int]]:
    return [(n.key, n.swa_tombstone, n.lock_ref, n.swa_lock_ref) for n in tree.snapshot().nodes[1:]]


def test_slid_tokens_become_a_tombstone_and_the_match_needs_a_window() -> None:
    alloc, tree = setup(window=2)
    x = alloc.alloc(6)
    assert x is not None
    alloc.free_swa(x[:2])
    assert tree.insert(RadixKey([1, 2, 3, 4, 5, 6]), x, 0, 2) == 0
    assert shape(tree) == [((1, 2), True, 0, 0), ((3, 4, 5, 6), False, 0, 0)]
    assert tree.match_prefix(RadixKey([1, 2, 3])).device_indices == []  # window would be gone
    assert tree.match_prefix(RadixKey([1, 2, 3, 4, 9])).device_indices == [1, 2, 3, 4]
    assert (tree.full_evictable_size(), tree.swa_evictable_size()) == (6, 4)
    check(alloc, tree)


def test_lock_takes_swa_locks_only_over_the_window() -> None:
    alloc, tree = setup(window=2)
    x = alloc.alloc(6)
    assert x is not None
    tree.insert(RadixKey([1, 2, 3, 4]), x[:4])
    # the first 4 slots are the tree's already: prev_prefix_len keeps insert from freeing them
    assert tree.insert(RadixKey([1, 2, 3, 4, 5, 6]), x, 4) == 4
    m = tree.match_prefix(RadixKey([1, 2, 3, 4, 5, 6]))
    uuid = tree.inc_lock_ref(m.last_device_node)
    assert uuid == 1
    assert shape(tree) == [((1, 2, 3, 4), False, 1, 0), ((5, 6), False, 1, 1)]
    assert tree.evict(0, 4) == (0, 4)  # the node above the window loses its SWA slots only
    assert shape(tree)[0] == ((1, 2, 3, 4), True, 1, 0)
    tree.dec_lock_ref(m.last_device_node, uuid)
    check(alloc, tree)
    with pytest.raises(LockError):
        tree.dec_lock_ref(m.last_device_node, uuid)
    with pytest.raises(InvalidArgumentError):
        tree.evict(-1)


def test_early_swa_release_tombstones_the_leaf_and_recovery_keeps_the_locked_full() -> None:
    alloc, tree = setup(window=2)
    x = alloc.alloc(4)
    assert x is not None
    tree.insert(RadixKey([1, 2, 3, 4]), x)
    m = tree.match_prefix(RadixKey([1, 2, 3, 4]))
    uuid = tree.inc_lock_ref(m.last_device_node)
    tree.dec_swa_lock_only(m.last_device_node, uuid)  # the request's window moved on
    assert shape(tree) == [((1, 2, 3, 4), True, 1, 0)]
    assert alloc.translate_loc_from_full_to_swa(x) == [0, 0, 0, 0]
    y = alloc.alloc(4)
    assert y is not None
    swa_y = alloc.translate_loc_from_full_to_swa(y)
    assert tree.insert(RadixKey([1, 2, 3, 4]), y) == 4  # recovery from another request
    assert shape(tree) == [((1, 2, 3, 4), False, 1, 0)]
    assert alloc.translate_loc_from_full_to_swa(x) == swa_y  # the locked full slots stay
    assert alloc.translate_loc_from_full_to_swa(y) == [0, 0, 0, 0]  # y's full slots freed
    assert tree.evict(0, 1) == (0, 4)  # full part still locked: tombstone again, not deleted
    assert shape(tree) == [((1, 2, 3, 4), True, 1, 0)]
    tree.dec_lock_ref(m.last_device_node, uuid, skip_swa=True)
    assert tree.evict(4) == (4, 0)
    assert alloc.full_available_size() == 32 and alloc.swa_available_size() == 16
    check(alloc, tree)

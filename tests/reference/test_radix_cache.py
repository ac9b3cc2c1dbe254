"""Unit tests of the reference RadixCache and ChunkCache (page sizes 1 and 4)."""

from __future__ import annotations

import pytest

from kvpool.constants import ceil_align, floor_align
from kvpool.errors import ConfigError, InvalidArgumentError, LockError
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator
from kvpool.reference.radix.chunk_cache import ChunkCache
from kvpool.reference.radix.radix_cache import RadixCache, logical_clock
from kvpool.reference.radix_key import RadixKey
from kvpool.reference.req import Req


def make(
    ps: int = 1, size: int = 64, policy: str = "lru"
) -> tuple[RadixCache, BaseTokenToKVPoolAllocator, ReqToTokenPool]:
    alloc: BaseTokenToKVPoolAllocator = (
        TokenToKVPoolAllocator(size) if ps == 1 else PagedTokenToKVPoolAllocator(size, ps)
    )
    pool = ReqToTokenPool(4, 64)
    return RadixCache(pool, alloc, ps, eviction_policy=policy), alloc, pool


def put(cache: RadixCache, alloc: BaseTokenToKVPoolAllocator, tokens: list[int]) -> int:
    """Insert ``tokens`` at freshly allocated slots, freeing the duplicates like a caller."""
    slots = alloc.alloc(ceil_align(len(tokens), alloc.page_size))
    assert slots is not None
    n = cache.insert(RadixKey(tokens), slots[: len(tokens)])
    aligned = floor_align(len(tokens), alloc.page_size)
    alloc.free(slots[:n] + slots[aligned:])  # duplicates and the uncached partial page
    return n


def test_logical_clock_counts() -> None:
    clock = logical_clock()
    assert [clock(), clock(), clock()] == [1.0, 2.0, 3.0]


def test_insert_returns_cached_length_and_frees_nothing() -> None:
    cache, alloc, _ = make()
    slots = alloc.alloc(5)
    assert slots == [1, 2, 3, 4, 5]
    assert cache.insert(RadixKey([1, 2, 3, 4, 5]), slots) == 0
    before = alloc.available_size()
    dup = alloc.alloc(4)
    assert dup is not None
    assert cache.insert(RadixKey([1, 2, 3, 9]), dup) == 3
    assert alloc.available_size() == before - 4  # insert freed nothing
    assert cache.total_size() == 6 and cache.evictable_size() == 6


def test_match_splits_and_numbers_nodes() -> None:
    cache, alloc, _ = make()
    put(cache, alloc, [1, 2, 3, 4, 5])  # node 1, t=1
    m = cache.match_prefix(RadixKey([1, 2, 7]))  # t=2, splits node 1 at 2
    assert m.device_indices == [1, 2]
    upper = m.last_device_node
    assert upper is not None and upper.node_id == 2
    # Hits are counted by insert only (the one that created node 1), copied to the upper half.
    assert upper.key.token_ids == [1, 2] and upper.hit_count == 1
    (lower,) = upper.children.values()
    assert lower.node_id == 1 and lower.key.token_ids == [3, 4, 5] and lower.hit_count == 1
    assert upper.last_access_time == lower.last_access_time == 2.0
    assert (upper.creation_time, lower.creation_time) == (2.0, 1.0)  # upper created by the split
    assert list(cache.root_node.children) == [(None, 1)]
    assert cache.evictable_size() == 5 == cache.total_size()


def test_match_caps_at_page_boundary_and_namespaces() -> None:
    cache, alloc, _ = make(ps=4)
    put(cache, alloc, [1, 1, 2, 2, 3, 3, 4, 4, 5, 5])  # only 8 tokens are inserted
    assert cache.total_size() == 8
    m = cache.match_prefix(RadixKey([1, 1, 2, 2, 3, 3, 4, 9]))
    assert len(m.device_indices) == 4  # the second page differs at its last token
    assert m.device_indices == [4, 5, 6, 7]
    assert cache.match_prefix(RadixKey([1, 1, 2, 2], "other")).device_indices == []
    root_keys = list(cache.root_node.children)
    assert root_keys == [(None, (1, 1, 2, 2))]
    snap = cache.snapshot()
    assert [n.node_id for n in snap.nodes] == [0, 2, 1]
    assert snap.nodes[1].child_keys == ((3, 3, 4, 4),)


def test_locks_move_sizes_and_refuse_negative() -> None:
    cache, alloc, _ = make()
    put(cache, alloc, [1, 2, 3])
    put(cache, alloc, [1, 2, 3, 4, 5])
    leaf = cache.match_prefix(RadixKey([1, 2, 3, 4, 5])).last_device_node
    assert leaf is not None
    assert cache.inc_lock_ref(leaf) == -5
    assert (cache.evictable_size(), cache.protected_size()) == (0, 5)
    assert cache.inc_lock_ref(leaf) == 0
    assert cache.dec_lock_ref(leaf) == 0
    assert cache.dec_lock_ref(leaf) == 5
    with pytest.raises(LockError):
        cache.dec_lock_ref(leaf)
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    assert cache.evict(100) == 5
    before = cache.snapshot()
    with pytest.raises(LockError):
        cache.inc_lock_ref(leaf)  # detached node
    assert cache.snapshot() == before


def test_lock_errors_are_atomic_over_the_path() -> None:
    # The upper node is locked, the leaf below it is not: unlocking from the leaf must fail
    # before touching the upper node (a walk that decrements as it goes would leave it at 0).
    cache, alloc, _ = make()
    put(cache, alloc, [1, 2, 3])
    put(cache, alloc, [1, 2, 3, 4, 5])
    upper = cache.match_prefix(RadixKey([1, 2, 3])).last_device_node
    leaf = cache.match_prefix(RadixKey([1, 2, 3, 4, 5])).last_device_node
    assert upper is not None and leaf is not None and leaf.parent is upper
    cache.inc_lock_ref(upper)
    before = cache.snapshot()
    with pytest.raises(LockError):
        cache.dec_lock_ref(leaf)
    assert cache.snapshot() == before
    assert (upper.lock_ref, cache.protected_size(), cache.evictable_size()) == (1, 3, 2)
    with pytest.raises(InvalidArgumentError):
        cache.insert(RadixKey([8, 9]), [40])  # fewer slots than tokens
    assert cache.snapshot() == before
    with pytest.raises(InvalidArgumentError):
        cache.evict(-1)
    assert cache.snapshot() == before


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        ("lru", [[3], [9]]),
        ("mru", [[5, 6], [1, 2]]),
        ("fifo", [[1, 2], [3]]),
        ("filo", [[9], [5, 6]]),
        ("lfu", [[3], [9]]),
        ("priority", [[3], [9]]),
    ],
)
def test_eviction_order_by_policy(policy: str, order: list[list[int]]) -> None:
    cache, alloc, _ = make(policy=policy)
    for tokens, prio in (([1, 2], 5), ([3], 0), ([5, 6], 3), ([9], 1)):
        slots = alloc.alloc(len(tokens))
        assert slots is not None
        cache.insert(RadixKey(tokens), slots, priority=prio)
    cache.match_prefix(RadixKey([1, 2, 7]))  # touch [1, 2] (t=5): one hit
    cache.match_prefix(RadixKey([5, 6]))  # touch [5, 6] (t=6)
    cache.match_prefix(RadixKey([5, 6]))  # t=7: two hits
    gone = []
    for _ in order:
        before = {tuple(c.key.token_ids) for c in cache.root_node.children.values()}
        cache.evict(1)
        after = {tuple(c.key.token_ids) for c in cache.root_node.children.values()}
        gone.append(list(next(iter(before - after))))
    assert gone == order


def test_evict_pushes_parents_whole_nodes_and_skips_locked() -> None:
    cache, alloc, _ = make()
    put(cache, alloc, [1, 2, 3, 4])
    put(cache, alloc, [1, 2, 5])
    put(cache, alloc, [7, 8])
    locked = cache.match_prefix(RadixKey([7, 8])).last_device_node
    cache.inc_lock_ref(locked)
    free_before = alloc.available_size()
    assert cache.evict(1) == 2  # [3, 4] (oldest leaf), whole node
    assert cache.evict(2) == 3  # [5], then its parent [1, 2] became an unlocked leaf
    assert cache.evict(10) == 0  # only the locked node is left
    assert alloc.available_size() == free_before + 5
    assert cache.total_size() == 2 == cache.protected_size()
    with pytest.raises(InvalidArgumentError):
        cache.evict(-1)


def test_reset_and_pretty_print() -> None:
    cache, alloc, _ = make()
    put(cache, alloc, [1, 2, 3])
    text = cache.pretty_print()
    assert "#1" in text and "key=[1,2,3](3)" in text and "evictable=3" in text
    cache.reset()
    assert cache.total_size() == 0 and cache.snapshot().nodes[0].node_id == 0
    assert len(cache.snapshot().nodes) == 1


def test_disabled_radix_cache_matches_nothing() -> None:
    alloc = TokenToKVPoolAllocator(16)
    cache = RadixCache(ReqToTokenPool(2, 8), alloc, 1, disable=True)
    assert cache.insert(RadixKey([1, 2]), alloc.alloc(2)) == 0  # slots the caller holds
    m = cache.match_prefix(RadixKey([1, 2, 3]))
    assert m.device_indices == [] and m.last_device_node is cache.root_node
    assert cache.snapshot().disabled and cache.snapshot().nodes == ()
    with pytest.raises(ConfigError):
        RadixCache(ReqToTokenPool(2, 8), alloc, 2)
    with pytest.raises(ConfigError):
        RadixCache(ReqToTokenPool(2, 8), alloc, 1, eviction_policy="arc")


def _running_req(pool: ReqToTokenPool, alloc: BaseTokenToKVPoolAllocator, tokens: list[int]) -> Req:
    req = Req("r", tokens)
    pool.alloc([req])
    slots = alloc.alloc(ceil_align(len(tokens), alloc.page_size))
    assert slots is not None
    assert req.req_pool_idx is not None
    pool.write((req.req_pool_idx, slice(0, len(tokens))), slots[: len(tokens)])
    req.kv_committed_len = req.kv_allocated_len = len(tokens)
    return req


def test_cache_finished_req_frees_duplicates_and_tail() -> None:
    cache, alloc, pool = make(ps=4, size=64)
    put(cache, alloc, [1, 1, 1, 1])  # page 1 in the tree
    req = _running_req(pool, alloc, [1, 1, 1, 1, 2, 2, 2, 2, 3])  # pages 2, 3, 4
    free_before = alloc.available_size()
    cache.cache_finished_req(req)
    # duplicate page 2 and tail page 4 freed; page 3 went into the tree
    assert alloc.available_size() == free_before + 8
    assert cache.total_size() == 8
    assert cache.match_prefix(RadixKey([1, 1, 1, 1, 2, 2, 2, 2])).device_indices == [
        4, 5, 6, 7, 12, 13, 14, 15,
    ]  # fmt: skip


def test_cache_unfinished_req_rewrites_row_and_moves_lock() -> None:
    cache, alloc, pool = make()
    put(cache, alloc, [1, 2, 3])  # slots 1..3
    req = _running_req(pool, alloc, [1, 2, 3, 4, 5])  # slots 4..8
    req.fill_ids = req.all_token_ids
    assert req.req_pool_idx is not None
    cache.cache_unfinished_req(req, chunked=True)
    assert pool.read(req.req_pool_idx, 0, 5) == [1, 2, 3, 7, 8]
    assert req.prefix_indices == [1, 2, 3, 7, 8]
    assert req.cache_protected_len == 5
    assert req.last_node is not None and req.last_node.lock_ref == 1
    assert cache.protected_size() == 5 and cache.evictable_size() == 0
    assert 4 in alloc.free_pages and 5 in alloc.free_pages and 6 in alloc.free_pages


def test_chunk_cache_is_a_no_tree_cache() -> None:
    alloc = TokenToKVPoolAllocator(16)
    pool = ReqToTokenPool(2, 8)
    cache = ChunkCache(pool, alloc, 1)
    assert cache.match_prefix(RadixKey([1, 2])).last_device_node is None
    assert cache.insert(RadixKey([1])) == 0 and cache.evict(5) == 0
    req = _running_req(pool, alloc, [4, 5, 6])
    req.fill_ids = [4, 5]
    cache.cache_unfinished_req(req)
    assert req.prefix_indices == [1, 2]
    free_before = alloc.available_size()
    cache.cache_finished_req(req)
    assert alloc.available_size() == free_before + 3
    assert cache.snapshot().nodes == () and "disabled" in cache.pretty_print()


def test_chunk_cache_refuses_a_request_without_a_row() -> None:
    alloc = TokenToKVPoolAllocator(8)
    cache = ChunkCache(ReqToTokenPool(2, 8), alloc, 1)
    req = Req("r", [1, 2])
    for action in (cache.cache_finished_req, cache.cache_unfinished_req):
        with pytest.raises(InvalidArgumentError):
            action(req)
        assert alloc.available_size() == 8

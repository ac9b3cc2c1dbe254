"""SGLang 0.5.16's observable radix-tree choices, asserted on both twins with the same calls:
hits are counted by ``insert`` (not by ``match_prefix``, not for chunked inserts), a split's upper
node is created at the split, ties follow SGLang's clock (the newer node first under MRU), and
``cache_finished_req`` frees the duplicates and the unaligned tail in two calls."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvpool import optimized as opt
from kvpool import reference as ref
from kvpool.constants import ceil_align

TWINS = ("reference", "optimized")


def build(twin: str, ps: int = 1, policy: str = "lru", size: int = 64) -> tuple[Any, Any, Any]:
    side: Any = ref if twin == "reference" else opt
    alloc = (
        side.TokenToKVPoolAllocator(size) if ps == 1 else side.PagedTokenToKVPoolAllocator(size, ps)
    )
    pool = side.ReqToTokenPool(4, 64)
    return side.RadixCache(pool, alloc, ps, eviction_policy=policy), alloc, pool


def key(twin: str, tokens: list[int]) -> Any:
    return (ref.RadixKey if twin == "reference" else opt.RadixKey)(tokens)


def plain(values: Any) -> list[int]:
    return list(values.tolist()) if isinstance(values, torch.Tensor) else list(values)


def put(twin: str, cache: Any, alloc: Any, tokens: list[int], chunked: bool = False) -> Any:
    """Insert ``tokens`` at fresh slots (page size 1); returns the node holding the last token."""
    slots = alloc.alloc(len(tokens))
    assert slots is not None
    cache.insert(key(twin, tokens), slots, chunked=chunked)
    return cache.match_prefix(key(twin, tokens)).last_device_node


def nodes(cache: Any) -> dict[tuple[int, ...], Any]:
    """Every non-root node by its key's tokens."""
    out: dict[tuple[int, ...], Any] = {}
    stack = list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        out[tuple(plain(node.key.token_ids))] = node
        stack.extend(node.children.values())
    return out


@pytest.mark.parametrize("twin", TWINS)
def test_insert_counts_hits_and_match_does_not(twin: str) -> None:
    cache, alloc, _ = build(twin)
    put(twin, cache, alloc, [1, 2, 3, 4, 5])
    cache.insert(key(twin, [1, 2, 9]), plain(alloc.alloc(3)))  # splits [1..5] after 2 tokens
    by_key = nodes(cache)
    hits = {k: n.hit_count for k, n in by_key.items()}
    assert hits == {(1, 2): 2, (3, 4, 5): 1, (9,): 1}
    cache.match_prefix(key(twin, [1, 2, 3, 4]))  # splits again, counts nothing
    assert {k: n.hit_count for k, n in nodes(cache).items()} == {
        (1, 2): 2, (3, 4): 1, (5,): 1, (9,): 1,
    }  # fmt: skip
    cache.insert(key(twin, [1, 2, 9, 7]), plain(alloc.alloc(4)), chunked=True)
    assert {k: n.hit_count for k, n in nodes(cache).items()}[(7,)] == 0  # a chunk counts none
    assert nodes(cache)[(1, 2)].hit_count == 2


@pytest.mark.parametrize("twin", TWINS)
def test_split_upper_node_is_created_at_the_split_fifo(twin: str) -> None:
    """A at t1, B at t2, a match at t3 splits A: the upper half is created at t3, so FIFO
    evicts the lower half, then B, and keeps the upper half."""
    cache, alloc, _ = build(twin, policy="fifo")
    put(twin, cache, alloc, [1, 2, 3, 4])
    put(twin, cache, alloc, [5, 6])
    cache.match_prefix(key(twin, [1, 2, 7]))
    by_key = nodes(cache)
    assert by_key[(1, 2)].creation_time > by_key[(5, 6)].creation_time
    assert cache.evict(3) == 4
    assert list(nodes(cache)) == [(1, 2)]


@pytest.mark.parametrize("twin", TWINS)
def test_mru_tie_goes_to_the_newer_node(twin: str) -> None:
    """An insert that splits stamps the lower half and creates the new leaf in one walk; SGLang's
    clock makes the leaf newer, so MRU evicts it first."""
    cache, alloc, _ = build(twin, policy="mru")
    put(twin, cache, alloc, [1, 2, 3, 4, 5])
    cache.insert(key(twin, [1, 2, 9]), plain(alloc.alloc(3)))
    by_key = nodes(cache)
    assert by_key[(3, 4, 5)].last_access_time == by_key[(9,)].last_access_time
    assert cache.evict(1) == 1
    assert (9,) not in nodes(cache) and (3, 4, 5) in nodes(cache)


@pytest.mark.parametrize("twin", TWINS)
def test_finish_frees_duplicates_then_tail_in_two_calls(twin: str) -> None:
    """ps 4: page 1 cached; the request holds pages 2 (duplicate), 3 (new) and 4 (tail). Two
    paged frees put page 4 in front of page 2; one call would have sorted them [2, 4]."""
    side: Any = ref if twin == "reference" else opt
    cache, alloc, pool = build(twin, ps=4, size=64)
    first = plain(alloc.alloc(4))
    cache.insert(key(twin, [1, 1, 1, 1]), first)
    tokens = [1, 1, 1, 1, 2, 2, 2, 2, 3]
    req = side.Req("r", tokens)
    pool.alloc([req])
    slots = plain(alloc.alloc(ceil_align(len(tokens), 4)))
    pool.write((req.req_pool_idx, slice(0, len(tokens))), slots[: len(tokens)])
    req.kv_committed_len = req.kv_allocated_len = len(tokens)
    cache.cache_finished_req(req)
    assert plain(alloc.free_pages)[:2] == [4, 2]

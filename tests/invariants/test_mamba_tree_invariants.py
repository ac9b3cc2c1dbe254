"""Each Mamba tree invariant fires on a damaged snapshot of a real tree, naming the offending
nodes, and stays quiet on the tree's own snapshots."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.errors import InvariantViolation
from kvpool.invariants import INVARIANTS
from kvpool.invariants.mamba_tree import check_mamba_tree
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.reference.mamba.radix_cache import MambaRadixCache
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator
from kvpool.reference.radix_key import RadixKey
from kvpool.snapshot import MambaTreeSnapshot


def tree() -> tuple[MambaRadixCache, MambaTreeSnapshot]:
    """[1, 2, 3] (node 2, a tombstone after the split) with children [4, 5] (node 1, state 1,
    locked) and [9] (node 3, state 2)."""
    pool = HybridReqToTokenPool(4, 16, 4)
    kv = TokenToKVPoolAllocator(32)
    cache = MambaRadixCache(pool, kv)
    for tokens in ([1, 2, 3, 4, 5], [1, 2, 3, 9]):
        value, slot = kv.alloc(len(tokens)), pool.mamba_allocator.alloc(1)
        assert value is not None and slot is not None
        cache.insert(RadixKey(tokens), value, slot[0])
    cache.inc_lock_ref(cache.match_prefix(RadixKey([1, 2, 3, 4, 5])).last_device_node)
    return cache, cache.snapshot()


def node(snap: MambaTreeSnapshot, node_id: int, **changes: object) -> MambaTreeSnapshot:
    nodes = tuple(dataclasses.replace(n, **changes) if n.node_id == node_id else n  # type: ignore[arg-type]
                  for n in snap.nodes)  # fmt: skip
    return dataclasses.replace(snap, nodes=nodes)


def fires(invariant_id: str, indices: tuple[int, ...], snap: MambaTreeSnapshot) -> None:
    with pytest.raises(InvariantViolation) as info:
        check_mamba_tree(snap)
    assert info.value.invariant_id == invariant_id, str(info.value)
    assert info.value.indices == indices


def test_real_snapshots_pass() -> None:
    cache, snap = tree()
    assert [n.node_id for n in snap.nodes] == [0, 2, 1, 3]
    assert check_mamba_tree(snap) == 2
    # also at pool scope: a hybrid manager's lifecycle with the radix cache on runs the tree
    assert {"mamba_tree", "pool"} == set(INVARIANTS["INV-MAMBA-TREE-SHAPE"].scopes)
    cache.evict(num_tokens=0, mamba_num=2)  # node 3 goes whole; node 1 is locked
    assert check_mamba_tree(cache.snapshot()) == 2


def test_tree_shape() -> None:
    _, snap = tree()
    fires("INV-MAMBA-TREE-SHAPE", (3,), node(snap, 3, mamba_value=None))  # a tombstone leaf
    fires("INV-MAMBA-TREE-SHAPE", (9,), node(snap, 2, child_ids=(1, 3, 9)))  # unknown child
    fires("INV-MAMBA-TREE-SHAPE", (1,), dataclasses.replace(snap, full_lru=(*snap.full_lru, 1)))
    fires("INV-MAMBA-TREE-SHAPE", (3,), dataclasses.replace(snap, mamba_lru=(1,)))


def test_tree_locks() -> None:
    _, snap = tree()
    fires("INV-MAMBA-TREE-LOCKS", (1,), node(snap, 1, mamba_lock_ref=2))  # state lock > KV lock
    fires("INV-MAMBA-TREE-LOCKS", (2,), node(snap, 2, mamba_lock_ref=1, full_lock_ref=1))
    fires("INV-MAMBA-TREE-LOCKS", (2,), node(snap, 2, full_lock_ref=0))  # below its child's
    with pytest.raises(InvariantViolation, match="sizes"):
        check_mamba_tree(dataclasses.replace(snap, mamba_evictable_size=2))

"""Worked examples of SGLang 0.5.16's unified FULL+MAMBA tree in kvpool's
``UnifiedMambaRadixCache`` (both twins): its two differences from 0.5.23's, the ``Rules`` knobs
its FULL+SWA set has too (a lock skipping a tombstone anchor, a split refreshing the cut node's
state), each shown against 0.5.23's value."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.errors import LockError
from kvpool.optimized import radix_key as opt_key
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool as OptPool
from kvpool.optimized.pools.allocator_choice import allocator_for as opt_allocator
from kvpool.optimized.unified.mamba_radix_cache import UnifiedMambaRadixCache as OptTree
from kvpool.reference import radix_key as ref_key
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool as RefPool
from kvpool.reference.pools.allocator_choice import allocator_for as ref_allocator
from kvpool.reference.unified.mamba_radix_cache import UnifiedMambaRadixCache as RefTree
from kvpool.rules import Rules

OLD = Rules.for_sglang("0.5.16")
NEW = Rules.for_sglang("0.5.23")
TWINS = ["reference", "optimized"]


class _Tree:
    """A tree of ``twin`` under ``rules`` over 32 token slots and 4 Mamba slots, with helpers
    that insert a key with a fresh state and find a node by its key."""

    def __init__(self, twin: str, rules: Rules) -> None:
        if twin == "reference":
            self.pool: Any = RefPool(4, 16, 4, 1, rules=rules)
            self.alloc: Any = ref_allocator(32, 1, rules=rules)
            self.tree: Any = RefTree(self.pool, self.alloc, 1, rules=rules)
            self.key: Any = ref_key.RadixKey
        else:
            self.pool = OptPool(4, 16, 4, 1, rules=rules)
            self.alloc = opt_allocator(32, 1, rules=rules)
            self.tree = OptTree(self.pool, self.alloc, 1, rules=rules)
            self.key = opt_key.RadixKey

    def insert(self, tokens: list[int]) -> tuple[int, bool]:
        state = self.pool.mamba_allocator.alloc(1)[0]
        cached, exist = self.tree.insert(self.key(tokens), self.alloc.alloc(len(tokens)),
                                         int(state))  # fmt: skip
        return int(cached), bool(exist)

    def node(self, tokens: tuple[int, ...]) -> Any:
        stack = [self.tree.root_node]
        while stack:
            node = stack.pop()
            if tuple(node.key.token_ids) == tokens:
                return node
            stack.extend(node.children.values())
        raise AssertionError(tokens)

    def sizes(self) -> tuple[int, int, int, int]:
        t = self.tree
        return (t.full_evictable_size(), t.mamba_evictable_size(), t.full_protected_size(),
                t.mamba_protected_size())  # fmt: skip


def _inner_tombstone(t: _Tree) -> Any:
    """[1 2] under [3 4], then [1 2]'s state evicted (the least recently used): a tombstone."""
    t.insert([1, 2])
    t.insert([1, 2, 3, 4])
    assert t.tree.evict(0, 1) == (0, 1)
    node = t.node((1, 2))
    assert node.mamba_value is None
    return node


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("rules", [NEW, OLD])
def test_a_lock_on_a_tombstone_anchor(twin: str, rules: Rules) -> None:
    t = _Tree(twin, rules)
    tomb = _inner_tombstone(t)
    t.tree.inc_lock_ref(tomb)
    counted = rules.unified_tombstone_lock == "count"
    # the KV of the path is locked either way; only 0.5.23 counts the state lock
    assert (tomb.full_lock_ref, tomb.mamba_lock_ref) == (1, 1 if counted else 0)
    assert t.sizes() == (2, 1, 2, 0)
    # a state stored on the locked tombstone: protected by 0.5.23's count, evictable in 0.5.16
    assert t.insert([1, 2]) == (2, False)
    assert t.sizes() == ((2, 1, 2, 1) if counted else (2, 2, 2, 0))
    t.tree.dec_lock_ref(tomb)
    assert (tomb.full_lock_ref, tomb.mamba_lock_ref) == (0, 0)
    assert t.sizes() == (4, 2, 0, 0)
    with pytest.raises(LockError):  # no lock open: misuse, nothing changed
        t.tree.dec_lock_ref(tomb)
    assert t.sizes() == (4, 2, 0, 0)


@pytest.mark.parametrize("twin", TWINS)
def test_a_counted_lock_is_undone_before_a_skipped_one(twin: str) -> None:
    """0.5.16's receipts: a lock skipped on the tombstone, a state stored, a counted lock; the
    first unlock gives back the counted one (the newest receipt), the second the skipped one."""
    t = _Tree(twin, OLD)
    tomb = _inner_tombstone(t)
    t.tree.inc_lock_ref(tomb)
    t.insert([1, 2])
    t.tree.inc_lock_ref(tomb)
    assert (tomb.full_lock_ref, tomb.mamba_lock_ref, t.sizes()) == (2, 1, (2, 1, 2, 1))
    t.tree.dec_lock_ref(tomb)
    assert (tomb.full_lock_ref, tomb.mamba_lock_ref, t.sizes()) == (1, 0, (2, 2, 2, 0))
    t.tree.dec_lock_ref(tomb)
    assert (tomb.full_lock_ref, tomb.mamba_lock_ref, t.sizes()) == (0, 0, (4, 2, 0, 0))


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("rules", [NEW, OLD])
def test_a_state_on_a_kv_locked_leaf(twin: str, rules: Rules) -> None:
    """A tombstone leaf locked, a state stored on it: 0.5.16's state eviction takes it (the leaf
    keeps its KV, a tombstone again); 0.5.23's lock protects it."""
    t = _Tree(twin, rules)
    tomb = _inner_tombstone(t)
    assert t.tree.evict(2, 0) == (2, 1)  # the leaf [3 4] and its state; [1 2] stays, a leaf
    assert not tomb.children
    t.tree.inc_lock_ref(tomb)
    t.insert([1, 2])
    if rules.unified_tombstone_lock == "count":
        assert t.tree.evict(0, 1) == (0, 0)
        assert tomb.mamba_value is not None
    else:
        assert t.tree.evict(0, 1) == (0, 1)
        assert (tomb.mamba_value, tomb.full_lock_ref, tomb.parent) == (None, 1, t.tree.root_node)
        assert t.sizes() == (0, 0, 2, 0)
    t.tree.dec_lock_ref(tomb)
    assert t.tree.evict(2, 0)[0] == 2  # now an ordinary unlocked leaf
    assert [n.key for n in t.tree.snapshot().nodes] == [()]


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("rules", [NEW, OLD])
def test_a_split_refreshes_the_cut_nodes_state_under_0516(twin: str, rules: Rules) -> None:
    t = _Tree(twin, rules)
    t.insert([1, 2, 3, 4])
    t.insert([5, 6])
    # a match that cuts [1 2 3 4] after two tokens: the upper half has no state, so the match
    # ends at the root (no state refreshed by the match itself)
    match = t.tree.match_prefix(t.key([1, 2, 9]))
    assert match.last_device_node is t.tree.root_node
    keys = {n.node_id: n.key for n in t.tree.snapshot().nodes}
    order = [keys[i] for i in t.tree.mamba_lru_list.ids()]
    front = rules.unified_split_recency == "front"
    assert order == ([(3, 4), (5, 6)] if front else [(5, 6), (3, 4)])
    # so the next state eviction takes [5 6] (0.5.16) or the cut node [3 4] (0.5.23), whole
    assert t.tree.evict(0, 1) == (2, 1)
    gone = (5, 6) if front else (3, 4)
    assert gone not in [n.key for n in t.tree.snapshot().nodes]

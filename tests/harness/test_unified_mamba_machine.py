"""The unified Mamba machine and kvpool's ``UnifiedMambaRadixCache`` (both twins): SGLang
0.5.23's FULL + MAMBA tree keeps tombstone leaves, counts one eviction's two amounts together,
refreshes a state an insert finds cached, counts the Mamba lock on a tombstone; bad calls are
refused with nothing changed; the twin runs clean against the reference on the
``unified_mamba_radix_cache`` machine, and two planted bugs (0.5.16's rules) are caught with
short traces."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError, LockError
from kvpool.invariants.unified_mamba_tree import check_unified_mamba_tree
from kvpool.optimized import radix_key as opt_key
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool as OptPool
from kvpool.optimized.mamba.radix_cache import MambaRadixCache as OptMamba
from kvpool.optimized.pools.token_allocator import TokenToKVPoolAllocator as OptAlloc
from kvpool.optimized.unified.mamba_radix_cache import UnifiedMambaRadixCache as OptUnified
from kvpool.reference import radix_key as ref_key
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool as RefPool
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator as RefAlloc
from kvpool.reference.unified.mamba_radix_cache import UnifiedMambaRadixCache as RefUnified
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE
from kvpool.testing.machines.hybrid import MachineMambaReq
from kvpool.testing.runs import execute
from kvpool.testing.swarm import Op

REF = reference_implementation()
MACHINE = "unified_mamba_radix_cache"


def _tree(twin: str, slots: int = 6) -> tuple[Any, Any, Any, Any]:
    """A tree over 32 token slots and ``slots`` Mamba slots; its pool, allocator, key type."""
    if twin == "reference":
        pool: Any = RefPool(4, 16, slots)
        alloc: Any = RefAlloc(32)
        return RefUnified(pool, alloc), pool, alloc, ref_key.RadixKey
    pool, alloc = OptPool(4, 16, slots), OptAlloc(32)
    return OptUnified(pool, alloc), pool, alloc, opt_key.RadixKey


def _put(tree: Any, pool: Any, alloc: Any, key: Any, tokens: list[int]) -> tuple[int, bool]:
    cached, exist = tree.insert(key(tokens), alloc.alloc(len(tokens)),
                                pool.mamba_allocator.alloc(1)[0])  # fmt: skip
    return int(cached), bool(exist)


def _rows(tree: Any) -> list[tuple[tuple[int, ...], int | None, int]]:
    """(key, state, Mamba lock) of every non-root node, in the snapshot's order."""
    return [(n.key, n.mamba_value, n.mamba_lock_ref) for n in tree.snapshot().nodes[1:]]


TWINS = ["reference", "optimized"]


@pytest.mark.parametrize("twin", TWINS)
def test_a_tombstone_leaf_keeps_its_kv(twin: str) -> None:
    tree, pool, alloc, key = _tree(twin)
    _put(tree, pool, alloc, key, [1, 2])
    _put(tree, pool, alloc, key, [1, 2, 3, 4])
    _put(tree, pool, alloc, key, [1, 2, 3, 4, 5])  # states on [1 2], [3 4], [5]
    assert tree.evict(0, 1) == (0, 1)  # the oldest state, [1 2]'s: a tombstone
    assert tree.evict(1, 0) == (1, 1)  # the leaf [5] goes with its state; [3 4] stays
    assert tree.evict(0, 1) == (2, 1)  # [3 4] is a leaf now: it goes whole
    assert _rows(tree) == [((1, 2), None, 0)]  # a tombstone leaf, holding its KV
    assert tree.evict(2, 0) == (2, 0)  # KV eviction takes it like any leaf
    assert alloc.available_size() == 32 and pool.mamba_allocator.available_size() == 6
    check_unified_mamba_tree(tree.snapshot())


@pytest.mark.parametrize("twin", TWINS)
def test_one_eviction_counts_both_walks(twin: str) -> None:
    tree, pool, alloc, key = _tree(twin)
    for tokens in ([3], [2], [3, 1, 3, 1, 3]):
        _put(tree, pool, alloc, key, tokens)
    # the KV walk frees [2] and [1 3 1 3] with their states: two states already, so the
    # state walk has nothing left to do ([3] keeps its state; 0.5.16 also evicted it)
    assert tree.evict(4, 2) == (5, 2)
    assert _rows(tree) == [((3,), 1, 0)]


@pytest.mark.parametrize("twin", TWINS)
def test_an_insert_finding_the_state_refreshes_it(twin: str) -> None:
    tree, pool, alloc, key = _tree(twin)
    _put(tree, pool, alloc, key, [1])
    _put(tree, pool, alloc, key, [2])
    assert _put(tree, pool, alloc, key, [1]) == (1, True)  # [1]'s state is now the newest
    pool.mamba_allocator.free([3])  # the caller's unused state slot
    assert tree.evict(0, 1) == (1, 1)
    assert _rows(tree) == [((1,), 1, 0)]


@pytest.mark.parametrize("twin", TWINS)
def test_the_mamba_lock_counts_a_tombstone(twin: str) -> None:
    tree, pool, alloc, key = _tree(twin)
    _put(tree, pool, alloc, key, [1, 2])
    _put(tree, pool, alloc, key, [1, 2, 3])
    tree.evict(0, 1)  # [1 2] becomes a tombstone
    node = tree.root_node.children[next(iter(tree.root_node.children))]
    tree.inc_lock_ref(node)
    assert _rows(tree) == [((1, 2), None, 1), ((3,), 2, 0)]
    assert _put(tree, pool, alloc, key, [1, 2]) == (2, False)  # revived while locked
    assert (tree.mamba_protected_size(), tree.mamba_evictable_size()) == (1, 1)
    tree.dec_lock_ref(node)
    assert (tree.mamba_protected_size(), tree.mamba_evictable_size()) == (0, 2)
    before = tree.snapshot()
    with pytest.raises(LockError):
        tree.dec_lock_ref(node)
    assert tree.snapshot() == before
    check_unified_mamba_tree(before)


@pytest.mark.parametrize("twin", TWINS)
def test_bad_calls_change_nothing(twin: str) -> None:
    tree, pool, alloc, key = _tree(twin)
    _put(tree, pool, alloc, key, [1, 2, 3])
    slots = alloc.alloc(1)
    state = (tree.snapshot(), alloc.snapshot(), pool.mamba_allocator.snapshot())
    with pytest.raises(InvalidArgumentError):
        tree.insert(key([7, 8]), slots, 4)
    with pytest.raises(InvalidArgumentError):
        tree.evict(-1, 0)
    with pytest.raises(InvalidArgumentError):
        tree.match_prefix(key([1, 2, 3]), None, cow_mamba=True)
    assert (tree.snapshot(), alloc.snapshot(), pool.mamba_allocator.snapshot()) == state


@pytest.mark.slow
def test_twin_unified_mamba_machine_runs_clean() -> None:
    result = run_machine(MACHINE, REF, optimized_implementation(), 3600.0, seed=5, max_runs=25)
    assert result.failure is None, result.failure.report
    reached = [t for t in CATALOGUE[MACHINE] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE[MACHINE]) - 2, reached


class DeletesTombstoneParents(OptUnified):
    """Planted: 0.5.16's leaf eviction, childless tombstone parents deleted with the leaf."""

    def _evict_leaf(self, leaf: Any) -> tuple[int, int]:
        parent = leaf.parent
        tokens, states = super()._evict_leaf(leaf)
        while (parent is not self.root_node and parent.mamba_value is None
               and not parent.children and parent.full_lock_ref == 0):  # fmt: skip
            up = parent.parent
            more, _ = super()._evict_leaf(parent)
            tokens, parent = tokens + more, up
        return tokens, states


class SkipsTombstoneLocks(OptUnified):
    """Planted: 0.5.16's lock, the Mamba lock taken only on a node holding a state."""

    inc_lock_ref = OptMamba.inc_lock_ref
    dec_lock_ref = OptMamba.dec_lock_ref


@pytest.mark.slow
@pytest.mark.parametrize("planted", [DeletesTombstoneParents, SkipsTombstoneLocks])
def test_planted_unified_mamba_bugs_are_caught(planted: type) -> None:
    def tree(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        return planted(pool, alloc, config.page_size)

    candidate = dataclasses.replace(optimized_implementation(), unified_mamba_radix_cache=tree)
    result = run_machine(MACHINE, REF, candidate, 3600.0, seed=1, max_runs=200)
    assert result.failure is not None
    assert result.failure.report.count("  step ") <= 12, result.failure.report


def test_a_request_copies_the_matched_state() -> None:
    tree, pool, alloc, key = _tree("reference", slots=2)
    _put(tree, pool, alloc, key, [1, 2])
    _put(tree, pool, alloc, key, [5])  # no slot left: a copy-on-write evicts a state
    req = MachineMambaReq()
    match = tree.match_prefix(key([1, 2, 9]), req, cow_mamba=True)
    assert match.device_indices == [1, 2] and match.cow_staged
    assert (req.mamba_pool_idx, req.mamba_cow_src_index) == (2, 1)
    assert _rows(tree) == [((1, 2), 1, 0)]  # [5] went whole; the matched node was locked


def test_a_copy_from_a_state_its_lock_no_longer_protects_expects_nothing() -> None:
    """The shrunk trace of a 0.5.16 campaign (``--sglang 0.5.16 --component
    unified_mamba_radix_cache --seed 20261203``, run 1480), under 0.5.16's rules, twin against
    reference. A direct lock taken while node 7 was a tombstone takes no Mamba lock; a request's
    copy-on-write match then locks the revived node, and the direct unlock releases a Mamba
    lock: the match's. The next insert evicts the staged state and reuses its slot, so the copy
    reads the new state. Both sides do so; the model expected the matched state and flagged
    INV-MAMBA-STATE-INTEGRITY. It now names no state for such a copy."""
    config = PoolConfig(size=36, page_size=1, req_pool_size=4, max_context_len=16,
                        mamba_slots=5, rules=Rules.for_sglang("0.5.16"))  # fmt: skip
    ns = "ns"
    ops = [Op("insert", ([2, 3, 2, 3, 1, 2], ns, False)), Op("lock_node", (3,)),
           Op("insert", ([2, 1, 3, 1], ns, False)), Op("insert", ([3, 2], None, True)),
           Op("insert", ([1, 1, 1, 1], None, True)), Op("match", ([3, 1, 1, 2, 3], None, True)),
           Op("match", ([1, 1, 3], None, True)), Op("match", ([1], None, False)),
           Op("insert", ([2, 1], None, True)), Op("insert", ([1, 1, 1], ns, True)),
           Op("lock_node", (6,)), Op("lock_node", (7,)), Op("lock_node", (4,)),
           Op("lock_node", (2,)), Op("insert", ([1, 1], None, True)),
           Op("match", ([1, 1, 2, 1, 2], None, True)), Op("unlock_node", (7,)),
           Op("insert", ([1, 3, 1, 1, 2], ns, True)), Op("forward", (7, 3))]  # fmt: skip
    done = execute(MACHINE, REF, optimized_implementation(), config, ops=ops)
    assert done.failure is None, done.failure and str(done.failure)
    assert done.steps == len(ops)
    assert done.coverage.get("copy:ok")

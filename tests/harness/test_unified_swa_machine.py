"""The unified SWA radix-cache machine and kvpool's ``UnifiedSWARadixCache`` (both twins): SGLang
0.5.23's FULL+SWA tree (new leaves capped at a window, tombstone leaves kept, policy-ordered full
eviction, window locks over tombstones), the SWA allocator's segment frees, bad input refused with
nothing changed; the twin runs clean against the reference, and two planted bugs (0.5.16's
rules) are caught with short traces."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import AlignmentError, InvalidArgumentError, KVPoolError
from kvpool.optimized import radix_key as opt_key
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator as OptAlloc
from kvpool.optimized.unified.swa_radix_cache import UnifiedSWARadixCache as OptTree
from kvpool.reference import radix_key as ref_key
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator as RefAlloc
from kvpool.reference.unified.swa_radix_cache import UnifiedSWARadixCache as RefTree
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE

REF = reference_implementation()
RULES = Rules.for_sglang("0.5.23")
TWINS = ["reference", "optimized"]


def _tree(twin: str, ps: int = 1, window: int = 2, policy: str = "lru") -> tuple[Any, Any, Any]:
    """A tree over 32 full and 32 SWA tokens, its allocator and its key type."""
    if twin == "reference":
        alloc: Any = RefAlloc(32, 32, ps, rules=RULES)
        return RefTree(alloc, ps, window, eviction_policy=policy), alloc, ref_key.RadixKey
    alloc = OptAlloc(32, 32, ps, rules=RULES)
    return OptTree(alloc, ps, window, eviction_policy=policy), alloc, opt_key.RadixKey


def _shape(tree: Any) -> list[tuple[tuple[int, ...], bool, int]]:
    return [(n.key, n.swa_tombstone, n.parent_id) for n in tree.snapshot().nodes[1:]]


@pytest.mark.parametrize("twin", TWINS)
def test_a_new_tail_is_capped_at_one_window(twin: str) -> None:
    tree, alloc, key = _tree(twin, window=2)
    slots = alloc.alloc(6)
    alloc.free_swa(slots[:1])  # token 0 left the window
    assert tree.insert(key([1, 2, 3, 4, 5, 6]), slots, 0, swa_evicted_seqlen=1) == 0
    # the leaf (id 1) is cut at the window cursor (tombstone above, id 2) and capped at two
    # tokens (its older part above it, id 3)
    assert _shape(tree) == [((1,), True, 0), ((2, 3, 4), False, 2), ((5, 6), False, 3)]
    assert [n.node_id for n in tree.snapshot().nodes[1:]] == [2, 3, 1]


@pytest.mark.parametrize("twin", TWINS)
def test_a_tail_outside_the_window_stays_as_a_tombstone_leaf(twin: str) -> None:
    tree, alloc, key = _tree(twin, window=2)
    slots = alloc.alloc(4)
    alloc.free_swa(slots)
    assert tree.insert(key([1, 2, 3, 4]), slots, 0, swa_evicted_seqlen=4) == 0
    assert _shape(tree) == [((1, 2, 3, 4), True, 0)]  # its full KV stays cached
    assert alloc.full_available_size() == 28
    assert tree.evict(1) == (4, 0)  # an ordinary full-evictable leaf
    assert alloc.full_available_size() == 32


@pytest.mark.parametrize("twin", TWINS)
def test_a_window_lock_counts_a_tombstone(twin: str) -> None:
    tree, alloc, key = _tree(twin, window=4)
    slots = alloc.alloc(5)
    alloc.free_swa(slots[:2])
    tree.insert(key([1, 2, 3, 4, 5]), slots, 0, swa_evicted_seqlen=2)
    # no match reaches the 3-token leaf (its window is short); SGLang's checkpoint locks the
    # node its insert ended on
    (upper,) = tree.root_node.children.values()
    (leaf,) = upper.children.values()
    uuid = tree.inc_lock_ref(leaf)  # the 4-token window reaches into the tombstone
    locks = [(n.swa_tombstone, n.swa_lock_ref) for n in tree.snapshot().nodes[1:]]
    assert locks == [(True, 1), (False, 1)] and uuid == 1
    tree.dec_swa_lock_only(leaf, uuid)  # a holder's own leaf is never tombstoned early
    assert [n.swa_tombstone for n in tree.snapshot().nodes[1:]] == [True, False]
    tree.dec_lock_ref(leaf, uuid, skip_swa=True)
    snap = tree.snapshot()
    assert (snap.protected_size, snap.swa_protected_size, snap.swa_evictable_size) == (0, 0, 3)


@pytest.mark.parametrize("twin", TWINS)
def test_full_eviction_follows_the_policy(twin: str) -> None:
    tree, alloc, key = _tree(twin, window=4, policy="fifo")
    tree.insert(key([1, 1]), alloc.alloc(2))  # created first
    tree.insert(key([2, 2]), alloc.alloc(2))
    tree.match_prefix(key([1, 1]))  # the most recently used: lru would keep it
    tree.evict(1)
    assert [n.key for n in tree.snapshot().nodes[1:]] == [(2, 2)]


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize(
    "bad",
    [
        {"swa_evicted_seqlen": 3},  # past the key
        {"swa_evicted_seqlen": 1},  # mid-page
        {"prev_prefix_len": -1},
        {"prev_prefix_len": 1.5},
    ],
)
def test_bad_insert_changes_nothing(twin: str, bad: dict[str, Any]) -> None:
    tree, alloc, key = _tree(twin, ps=2)
    slots = alloc.alloc_extend([0], [0], [2], [2], [-1], 2)
    before = (tree.snapshot(), alloc.snapshot())
    with pytest.raises(InvalidArgumentError):
        tree.insert(key([1, 2]), slots, **bad)
    assert (tree.snapshot(), alloc.snapshot()) == before


@pytest.mark.parametrize("twin", TWINS)
def test_segment_frees_of_the_swa_allocator(twin: str) -> None:
    _, alloc, _ = _tree(twin, ps=2)
    row = alloc.alloc_extend([0], [0], [6], [6], [-1], 6)
    before = alloc.snapshot()
    calls: list[tuple[Callable[[], None], type[KVPoolError]]] = [
        (lambda: alloc.free_full(row[:2]), InvalidArgumentError),  # still mapped
        (lambda: alloc.free_full_segment(row[:2], 0), InvalidArgumentError),
        (lambda: alloc.free_segment(row[2:], 1), AlignmentError),
        (lambda: alloc.free_swa_segment([99], 0), KVPoolError),
    ]
    for call, exc in calls:
        with pytest.raises(exc):
            call()
        assert alloc.snapshot() == before
    alloc.free_swa_segment(row[:2], 0)  # the first page left the window
    assert list(alloc.translate_loc_from_full_to_swa(row))[:2] == [0, 0]
    alloc.free_full_segment(row[:2], 0)
    alloc.free_segment(row[2:], 2)
    assert (alloc.full_available_size(), alloc.swa_available_size()) == (32, 32)


@pytest.mark.slow
def test_twin_unified_swa_machine_runs_clean() -> None:
    result = run_machine("unified_swa_radix_cache", REF, optimized_implementation(), 3600.0,
                         seed=5, max_runs=12)  # fmt: skip
    assert result.failure is None, result.failure.report
    reached = [t for t in CATALOGUE["unified_swa_radix_cache"] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE["unified_swa_radix_cache"]) - 3, reached


class FreesOutOfWindowTails(OptTree):
    """Planted: 0.5.16's insert, a tail wholly outside the window is freed, no leaf added."""

    def _new_tail(self, parent: Any, key: Any, value: Any, start: int, evicted: int) -> Any:
        if evicted >= start + len(key):
            self.token_to_kv_pool_allocator.free(value)
            return parent
        return super()._new_tail(parent, key, value, start, evicted)


class LRUOnly(OptTree):
    """Planted: 0.5.16's full eviction, least recently used whatever the policy."""

    def _full_key(self, node: Any) -> tuple[float, ...]:
        return (node.last_access_time,)


@pytest.mark.slow
@pytest.mark.parametrize("planted", [FreesOutOfWindowTails, LRUOnly])
def test_planted_unified_swa_bugs_are_caught(planted: type) -> None:
    def tree(config: PoolConfig, alloc: Any) -> Any:
        return planted(alloc, config.page_size, config.sliding_window or 1,
                       eviction_policy=config.eviction_policy,
                       is_eagle=config.is_eagle)  # fmt: skip

    candidate = dataclasses.replace(optimized_implementation(), unified_swa_radix_cache=tree)
    result = run_machine("unified_swa_radix_cache", REF, candidate, 3600.0, seed=1,
                         max_runs=200)  # fmt: skip
    assert result.failure is not None
    assert result.failure.detector == "lockstep-diff", result.failure.report
    assert result.failure.report.count("  step ") <= 12, result.failure.report

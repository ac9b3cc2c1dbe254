"""The unified-radix-cache machine and kvpool's ``UnifiedRadixCache`` (both twins): the tree
frees an insert's duplicates itself, a split keeps the creation time, a bad ``prev_prefix_len``
is refused with nothing changed; the twin runs clean against the reference, and two planted
bugs (the legacy contracts) are caught with short traces."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError
from kvpool.optimized import radix_key as opt_key
from kvpool.optimized.pools.paged_allocator import PagedTokenToKVPoolAllocator as OptPaged
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool as OptTable
from kvpool.optimized.unified.radix_cache import UnifiedRadixCache as OptUnified
from kvpool.reference import radix_key as ref_key
from kvpool.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator as RefPaged
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool as RefTable
from kvpool.reference.unified.radix_cache import UnifiedRadixCache as RefUnified
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE

REF = reference_implementation()
RULES = Rules.for_sglang("0.5.23")


def _tree(twin: str, policy: str = "lru") -> tuple[Any, Any, Any]:
    """A unified tree of 16 pages of 2 tokens over its own allocator, and its key type."""
    if twin == "reference":
        alloc: Any = RefPaged(32, 2, False, rules=RULES)
        tree: Any = RefUnified(RefTable(4, 64), alloc, 2, False, policy, rules=RULES)
        return tree, alloc, ref_key.RadixKey
    alloc = OptPaged(32, 2, False, rules=RULES)
    tree = OptUnified(OptTable(4, 64), alloc, 2, False, policy, rules=RULES)
    return tree, alloc, opt_key.RadixKey


def _free(alloc: Any) -> list[int]:
    return list(alloc.snapshot().free_pages)


@pytest.mark.parametrize("twin", ["reference", "optimized"])
def test_insert_frees_the_duplicates_past_prev_prefix_len(twin: str) -> None:
    tree, alloc, key = _tree(twin)
    first = alloc.alloc(6)
    assert tree.insert(key([1, 2, 3, 4, 5, 6]), first, prev_prefix_len=0) == 0
    free_before = _free(alloc)
    second = alloc.alloc(6)
    # 4 tokens already cached: slots [2, 4) of the new value are duplicates past P=2
    assert tree.insert(key([1, 2, 3, 4, 9, 9]), second, prev_prefix_len=2) == 4
    pages = [int(s) // 2 for s in list(second)[::2]]  # three pages of 2 tokens
    after = set(_free(alloc))
    assert pages[1] in after  # the duplicate page past P: freed by the tree
    assert pages[0] not in after and pages[2] not in after  # P's own page, the new leaf's
    assert len(after) == len(free_before) - 3 + 1
    # None: the legacy contract, nothing freed by the tree
    third = alloc.alloc(2)
    held = _free(alloc)
    assert tree.insert(key([1, 2]), third) == 2
    assert _free(alloc) == held


@pytest.mark.parametrize("twin", ["reference", "optimized"])
@pytest.mark.parametrize("bad", [-1, 7, 2.0, True, "2"])
def test_bad_prev_prefix_len_changes_nothing(twin: str, bad: Any) -> None:
    tree, alloc, key = _tree(twin)
    slots = alloc.alloc(6)
    before = (tree.snapshot(), alloc.snapshot())
    with pytest.raises(InvalidArgumentError, match="prev_prefix_len"):
        tree.insert(key([1, 2, 3, 4, 5, 6]), slots, prev_prefix_len=bad)
    assert (tree.snapshot(), alloc.snapshot()) == before


@pytest.mark.parametrize("twin", ["reference", "optimized"])
def test_a_split_keeps_the_creation_time(twin: str) -> None:
    tree, alloc, key = _tree(twin, "fifo")
    tree.insert(key([1, 1, 2, 2]), alloc.alloc(4), prev_prefix_len=0)  # oldest
    tree.insert(key([3, 3]), alloc.alloc(2), prev_prefix_len=0)
    tree.match_prefix(key([1, 1, 5, 5]))  # splits the oldest node: [1, 1] | [2, 2]
    tree.evict(2)  # fifo: the lower half [2, 2], created first
    tree.evict(2)  # the upper half is as old as it: before [3, 3] (the legacy tree: after)
    keys = [n.key for n in tree.snapshot().nodes[1:]]
    assert keys == [(3, 3)]


@pytest.mark.slow
def test_twin_unified_machine_runs_clean() -> None:
    result = run_machine("unified_radix_cache", REF, optimized_implementation(), 3600.0, seed=5,
                         max_runs=20)  # fmt: skip
    assert result.failure is None, result.failure.report
    reached = [t for t in CATALOGUE["unified_radix_cache"] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE["unified_radix_cache"]) - 2, reached


class KeepsDuplicates(OptUnified):
    """Planted: the legacy contract, an insert leaves its duplicates to the caller (a leak)."""

    def insert(self, key: Any, value: Any = None, *args: Any, **kwargs: Any) -> int:
        kwargs.pop("prev_prefix_len", None)
        return super().insert(key, value, *args, **kwargs)


class SplitStampsNow(OptUnified):
    """Planted: the legacy split, the upper half created at the walk's time."""

    def _split(self, child: Any, at: int) -> Any:
        upper = super()._split(child, at)
        upper.creation_time = upper.last_access_time
        return upper


@pytest.mark.slow
@pytest.mark.parametrize(("planted", "detector"), [(KeepsDuplicates, "INV-"),
                                                   (SplitStampsNow, "lockstep-diff")])  # fmt: skip
def test_planted_unified_bugs_are_caught(planted: type, detector: str) -> None:
    def tree(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        return planted(pool, alloc, config.page_size, False, config.eviction_policy,
                       rules=config.rules, is_eagle=config.is_eagle)  # fmt: skip

    candidate = dataclasses.replace(optimized_implementation(), unified_radix_cache=tree)
    result = run_machine("unified_radix_cache", REF, candidate, 3600.0, seed=1, max_runs=200)
    assert result.failure is not None
    assert result.failure.detector.startswith(detector), result.failure.report
    assert result.failure.report.count("  step ") <= 12, result.failure.report

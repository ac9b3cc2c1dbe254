"""SGLang 0.5.16's FULL+SWA ``UnifiedRadixCache`` in the torch twin's SWA lifecycle
(``Rules.swa_tree == "unified"``, ``Rules.for_sglang("0.5.16")``): the reference's worked
examples (tests/reference/test_swa_lifecycle_unified_0516.py) on both twins, and the twin in
lockstep with the reference under 0.5.16's rules with the radix cache on."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.config import PoolConfig
from kvpool.invariants import check_all
from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager as TwinSWAMemoryManager
from kvpool.optimized.lifecycle.swa_radix_lifecycle import (
    UnifiedSWARadixLifecycleV0516 as TwinLifecycle,
)
from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.reference.lifecycle.swa_radix_lifecycle import UnifiedSWARadixLifecycleV0516
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.swa_manager import SWALifecycleTarget
from kvpool.testing.swarm import RandomChooser

OLD = Rules.for_sglang("0.5.16")
LEGACY = dataclasses.replace(OLD, swa_tree="swa_radix")
MANAGERS = [SWAMemoryManager, TwinSWAMemoryManager]


def manager(cls: type, rules: Rules, page_size: int = 1, policy: str = "lru", size: int = 64,
            ratio: float = 0.8, need_sort: bool = False) -> SWAMemoryManager:  # fmt: skip
    mm: SWAMemoryManager = cls(PoolConfig(size=size, page_size=page_size,
                                          disable_radix_cache=False, sliding_window=2,
                                          swa_full_tokens_ratio=ratio, rules=rules,
                                          eviction_policy=policy, need_sort=need_sort))  # fmt: skip
    return mm


def tree_type(mm: SWAMemoryManager) -> type[object]:
    """The class of ``mm``'s tree cache."""
    tree: object = mm.tree_cache
    return type(tree)


def nodes(mm: SWAMemoryManager) -> list[tuple[tuple[int, ...], bool]]:
    snap = mm.snapshot()
    check_all(snap)
    assert snap.tree is not None
    return [(n.key, n.swa_tombstone) for n in snap.tree.nodes[1:]]


def test_the_twin_pairs_the_unified_tree_under_0_5_16() -> None:
    assert tree_type(manager(TwinSWAMemoryManager, OLD)) is TwinLifecycle
    assert tree_type(manager(SWAMemoryManager, OLD)) is UnifiedSWARadixLifecycleV0516


@pytest.mark.parametrize("cls", MANAGERS)
def test_an_abort_frees_its_row_in_one_free(cls: type) -> None:
    for rules, pages in {OLD: (1, 2, 3, 4), LEGACY: (4, 1, 2, 3)}.items():
        mm = manager(cls, rules, page_size=2, size=32, need_sort=True)
        mm.new_req("a", [1, 2, 3, 4, 5, 6])
        mm.extend(["a"])
        mm.decode(["a"], [7])
        mm.abort("a")
        snap = mm.snapshot()
        check_all(snap)
        assert snap.swa is not None
        assert snap.swa.full.release_pages == pages, rules.swa_tree


@pytest.mark.parametrize("cls", MANAGERS)
def test_a_chunk_inserts_with_the_requests_window_cursor(cls: type) -> None:
    mm = manager(cls, OLD)
    mm.open_session("s")
    mm.new_req("t1", [1, 2, 3, 4, 5, 6], session_id="s")
    mm.extend(["t1"])
    mm.decode(["t1"], [7])
    mm.decode(["t1"], [8])
    mm.finish(["t1"])
    mm.new_req("t2", [9, 10, 11, 12], session_id="s")
    mm.extend(["t2"], [2])
    assert nodes(mm) == [((1, 2, 3, 4, 5), True), ((6, 7, 8), False), ((9, 10), False)]


@pytest.mark.parametrize("cls", MANAGERS)
def test_full_eviction_follows_the_policy(cls: type) -> None:
    expected = {OLD: [((1, 2), False), ((3, 4), False)], LEGACY: [((5, 6, 7, 8), False)]}
    for rules, left in expected.items():
        mm = manager(cls, rules, policy="mru", size=12, ratio=1.0)
        for rid, tokens in (("a", [1, 2, 3, 4]), ("b", [5, 6, 7, 8])):
            mm.new_req(rid, tokens)
            mm.extend([rid])
            mm.finish([rid])
        assert mm.evict(3) == 4
        assert nodes(mm) == left, rules.swa_tree


def test_reference_and_twin_agree_on_0_5_16s_unified_tree() -> None:
    twin = dataclasses.replace(optimized_implementation("torch", checked=True), rules=OLD)
    target = SWALifecycleTarget()

    def radix_on(c: RandomChooser) -> PoolConfig:
        return dataclasses.replace(target.draw_config(c, twin), disable_radix_cache=False)

    result = run_machine("swa_manager", reference_implementation(), twin, 1e9, seed=516,
                         steps_per_run=60, max_runs=24, config_drawer=radix_on)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.steps >= 24 * 40
    for tag in ("decode:window-slid", "radix:tombstoned", "radix:recovered", "extend:chunked",
                "session:restore", "spec_step:window-slid"):  # fmt: skip
        assert result.coverage.get(tag), (tag, dict(result.coverage))

"""A hybrid model with the radix cache on under SGLang 0.5.23's rules (``Rules.mamba_tree ==
"unified"``): the lifecycle's tree is the FULL+MAMBA unified tree with 0.5.23's release path, on
both twins. A worked example (a finished request's state donated by its checkpoint, a
copy-on-write match, a chunk's copy without a second match, an abort of a waiting request
returning its slot, admission evicting exactly the shortfall of states before the KV), the
configuration checks, and a seeded lockstep campaign of the reference against the twin on the
configurations the swarm draws for it."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool import optimized, reference
from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.invariants import check_all
from kvpool.invariants.mamba import tree_checkpoints
from kvpool.reference.unified.mamba_release import UnifiedMambaLifecycleCache
from kvpool.rules import Rules
from kvpool.snapshot import PoolSnapshot
from kvpool.tags import mamba_state_tag
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.swarm import RandomChooser, draw_config

RULES = Rules.for_sglang("0.5.23")
TWINS = pytest.mark.parametrize("twin", [reference, optimized], ids=["reference", "optimized"])


def manager(twin: Any, slots: int = 3, size: int = 64) -> Any:
    config = PoolConfig(size=size, req_pool_size=4, max_context_len=32, mamba_slots=slots,
                        rules=RULES)  # fmt: skip
    if twin is reference:
        return twin.MemoryManager(config)
    return twin.MemoryManager(config, checked=True)


def snap(mm: Any) -> PoolSnapshot:
    s: PoolSnapshot = mm.snapshot()
    assert check_all(s) > 0
    assert s.mamba is not None and s.mamba.tree is not None and s.mamba.tree.unified
    return s


def free_slots(mm: Any) -> tuple[int, ...]:
    s = snap(mm)
    assert s.mamba is not None
    return tuple(s.mamba.pool.mamba_allocator.free_slots)


def cached(mm: Any) -> dict[int, int]:
    """Cached state slot -> the tag of its node's path."""
    s = snap(mm)
    assert s.mamba is not None and s.mamba.tree is not None
    return dict(tree_checkpoints(s.mamba.tree))


def test_the_0_5_23_preset_selects_the_unified_tree() -> None:
    assert RULES.mamba_tree == "unified" and RULES.release_path == "checkpoint"
    assert Rules().mamba_tree == "mamba_radix" and Rules.for_sglang("0.5.16").mamba_tree == (
        "unified"
    )  # 0.5.16's with its own release: tests/reference/test_unified_mamba_lifecycle_0516.py
    assert isinstance(manager(reference).tree_cache, UnifiedMambaLifecycleCache)


@TWINS
def test_the_legacy_tree_with_0_5_23_s_release_is_refused(twin: Any) -> None:
    # 0.5.23 ships no legacy Mamba tree (the unified tree with 0.5.16's release is 0.5.16's)
    rules = Rules(release_path="checkpoint")
    config = PoolConfig(size=64, req_pool_size=4, mamba_slots=3, rules=rules)
    with pytest.raises(ConfigError):
        twin.MemoryManager(config)


@TWINS
def test_worked_example(twin: Any) -> None:
    mm = manager(twin)
    # a finishes: its checkpoint donates slot 1 to the node of [1, 2, 3, 4]
    mm.new_req("a", [1, 2, 3])
    mm.extend(["a"])
    mm.decode(["a"], [4])
    mm.finish(["a"])
    assert cached(mm) == {1: mamba_state_tag([1, 2, 3, 4])}
    assert free_slots(mm) == (2, 3)
    # b matches it: a slot of its own (2) holding a copy; aborting b while it waits returns it
    mm.new_req("b", [1, 2, 3, 4, 5, 6])
    assert mm.match_prefix("b") == 4
    s = snap(mm)
    assert s.mamba is not None
    assert [(r.rid, r.row, r.slot) for r in s.mamba.reqs] == [("b", None, 2)]
    assert s.mamba.pool.mamba_pool.state_tag(2) == mamba_state_tag([1, 2, 3, 4])
    mm.abort("b")
    assert free_slots(mm) == (3, 2)
    # c runs in two chunks: a copy of [1..4] in slot 3, then one token; its chunk's checkpoint
    # caches a copy (slot 2) and moves its lock to the new node, whose state is then locked
    mm.new_req("c", [1, 2, 3, 4, 5, 6, 7])
    mm.extend(["c"], [1])
    assert cached(mm) == {1: mamba_state_tag([1, 2, 3, 4]), 2: mamba_state_tag([1, 2, 3, 4, 5])}
    s = snap(mm)
    assert s.mamba is not None and s.mamba.tree is not None
    locked = [n.mamba_value for n in s.mamba.tree.nodes[1:] if n.mamba_lock_ref]
    assert locked == [2] and s.mamba.tree.mamba_evictable_size == 1
    mm.extend(["c"])
    # d needs a slot and none is free: admission evicts exactly one state (the unlocked one,
    # slot 1: its node becomes a tombstone) before the KV is allocated
    mm.new_req("d", [9, 9])
    mm.extend(["d"])
    assert cached(mm) == {2: mamba_state_tag([1, 2, 3, 4, 5])}
    s = snap(mm)
    assert s.mamba is not None and s.mamba.tree is not None
    assert [n.key for n in s.mamba.tree.nodes if n.mamba_value is None][1:] == [(1, 2, 3, 4)]
    # c aborted: its KV past the tree's part and its slot go back; the tree keeps its states
    mm.abort("c")
    mm.finish(["d"])  # d's state donated to [9, 9]
    assert cached(mm) == {2: mamba_state_tag([1, 2, 3, 4, 5]), 1: mamba_state_tag([9, 9])}
    assert free_slots(mm) == (3,)


def hybrid_tree_config(c: RandomChooser) -> PoolConfig:
    """A hybrid configuration with the radix cache on, as the swarm draws them under 0.5.23's
    rules."""
    config = draw_config(c, page_size=1, hybrid=True, rules=RULES, disable_radix_cache=False,
                         need_sort=True)  # fmt: skip
    assert config.mamba_slots is not None and config.rules.mamba_tree == "unified"
    return config


def test_the_swarm_draws_the_unified_tree_under_0_5_23_rules() -> None:
    config = draw_config(RandomChooser(5), page_size=1, hybrid=True, rules=RULES,
                         disable_radix_cache=False, need_sort=True)  # fmt: skip
    assert config.mamba_slots is not None and not config.disable_radix_cache


@pytest.mark.slow
def test_reference_and_twin_agree_on_hybrid_configurations_with_the_unified_tree() -> None:
    result = run_machine("manager", reference_implementation(), optimized_implementation(),
                         3600.0, seed=7, max_runs=6, config_drawer=hybrid_tree_config)  # fmt: skip
    assert result.failure is None, result.failure.report
    for tag in ("mamba-radix:cow", "mamba-radix:donated", "mamba-radix:chunk-copy",
                "mamba-radix:evicted"):  # fmt: skip
        assert result.coverage.get(tag), (tag, dict(result.coverage))

"""A hybrid model with the radix cache on under SGLang 0.5.16's rules, on both twins: the
unified FULL+MAMBA tree with 0.5.16's release (``UnifiedMambaLifecycleCacheV0516`` in each
twin). The twin builds the same tree as the reference, and a seeded lockstep campaign of the
reference against the twin on the configurations the swarm draws for these rules reaches the
tree's copy-on-write, donation, chunk copy and eviction."""

from __future__ import annotations

from kvpool.config import PoolConfig
from kvpool.optimized.lifecycle.memory_manager import MemoryManager as OptMemoryManager
from kvpool.optimized.unified.mamba_release import (
    UnifiedMambaLifecycleCacheV0516 as OptUnifiedMambaLifecycleCacheV0516,
)
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.reference.unified.mamba_release import UnifiedMambaLifecycleCacheV0516
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.swarm import RandomChooser, draw_config

RULES = Rules.for_sglang("0.5.16")


def test_both_twins_pair_the_unified_tree_with_0_5_16_s_release() -> None:
    config = PoolConfig(size=64, req_pool_size=4, mamba_slots=3, rules=RULES)
    assert isinstance(MemoryManager(config).tree_cache, UnifiedMambaLifecycleCacheV0516)
    twin = OptMemoryManager(config, checked=True).tree_cache
    assert isinstance(twin, OptUnifiedMambaLifecycleCacheV0516)


def hybrid_tree_config(c: RandomChooser) -> PoolConfig:
    """A hybrid configuration with the radix cache on, as the swarm draws them under 0.5.16's
    rules."""
    config = draw_config(c, page_size=1, hybrid=True, rules=RULES, disable_radix_cache=False,
                         need_sort=True)  # fmt: skip
    assert config.mamba_slots is not None and config.rules.mamba_tree == "unified"
    return config


def test_reference_and_twin_agree_under_0_5_16_s_release() -> None:
    result = run_machine("manager", reference_implementation(), optimized_implementation(),
                         3600.0, seed=7, max_runs=24, config_drawer=hybrid_tree_config)  # fmt: skip
    assert result.failure is None, result.failure.report
    for tag in ("mamba-radix:cow", "mamba-radix:donated", "mamba-radix:chunk-copy",
                "mamba-radix:evicted"):  # fmt: skip
        assert result.coverage.get(tag), (tag, dict(result.coverage))

"""Differential test: the reference ``UnifiedMambaRadixCache`` and the optimized twin under SGLang
0.5.16's rules (its unified tree's Mamba lock skipping a tombstone anchor and its split
refreshing the cut node's state: ``Rules.unified_tombstone_lock`` and
``Rules.unified_split_recency``), in lockstep through the ``unified_mamba_radix_cache`` machine;
a twin that ignores one of the knobs is caught."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.optimized.unified.mamba_radix_cache import UnifiedMambaRadixCache as OptTree
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation

OLD = Rules.for_sglang("0.5.16")
MACHINE = "unified_mamba_radix_cache"


def test_twin_runs_clean_under_0516_rules() -> None:
    candidate = dataclasses.replace(optimized_implementation(), rules=OLD)
    result = run_machine(MACHINE, reference_implementation(), candidate, 3600.0, seed=16,
                         max_runs=8)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == 8 * 60
    assert result.coverage.get("lock_node:tombstone", 0)
    assert result.coverage.get("match:split", 0) and result.coverage.get("evict:leaf", 0)


@pytest.mark.parametrize("knob", ["unified_tombstone_lock", "unified_split_recency"])
def test_a_twin_ignoring_a_knob_is_caught(knob: str) -> None:
    lax = dataclasses.replace(OLD, **{knob: getattr(Rules.for_sglang("0.5.23"), knob)})

    def tree(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        return OptTree(pool, alloc, config.page_size, rules=lax)

    candidate = dataclasses.replace(optimized_implementation(), rules=OLD,
                                    unified_mamba_radix_cache=tree)  # fmt: skip
    result = run_machine(MACHINE, reference_implementation(), candidate, 3600.0, seed=1,
                         max_runs=200)  # fmt: skip
    assert result.failure is not None
    # the two trees diverge (a split recency ignored: they evict different states, which the
    # model's checkpoint tags, the reference's, catch on the twin first)
    assert result.failure.detector in ("lockstep-diff", "INV-MAMBA-CHECKPOINT"), (
        result.failure.report
    )
    assert result.failure.report.count("  step ") <= 8, result.failure.report

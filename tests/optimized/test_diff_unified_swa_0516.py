"""Differential test: the reference ``UnifiedSWARadixCache`` and the optimized twin under SGLang
0.5.16's rules (its unified tree's split recency, tombstone-skipping window locks and plain
frees: the ``Rules.unified_*`` knobs), in lockstep through the ``unified_swa_radix_cache``
machine; a twin that ignores one of the knobs is caught."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.optimized.unified.swa_radix_cache import UnifiedSWARadixCache as OptTree
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation

OLD = Rules.for_sglang("0.5.16")


def test_twin_runs_clean_under_0516_rules() -> None:
    candidate = dataclasses.replace(optimized_implementation(), rules=OLD)
    result = run_machine("unified_swa_radix_cache", reference_implementation(), candidate,
                         3600.0, seed=16, max_runs=6)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == 6 * 60
    assert result.coverage.get("insert:recovered", 0) and result.coverage.get("evict:freed", 0)


@pytest.mark.parametrize("knob", ["unified_free", "unified_split_recency"])
def test_a_twin_ignoring_a_knob_is_caught(knob: str) -> None:
    lax = dataclasses.replace(OLD, **{knob: getattr(Rules.for_sglang("0.5.23"), knob)})

    def tree(config: PoolConfig, alloc: Any) -> Any:
        return OptTree(alloc, config.page_size, config.sliding_window or 1,
                       eviction_policy=config.eviction_policy, rules=lax,
                       is_eagle=config.is_eagle)  # fmt: skip

    candidate = dataclasses.replace(optimized_implementation(), rules=OLD,
                                    unified_swa_radix_cache=tree)  # fmt: skip
    result = run_machine("unified_swa_radix_cache", reference_implementation(), candidate,
                         3600.0, seed=1, max_runs=100)  # fmt: skip
    assert result.failure is not None
    assert result.failure.detector == "lockstep-diff", result.failure.report
    assert result.failure.report.count("  step ") <= 8, result.failure.report

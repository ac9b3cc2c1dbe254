"""Differential test: the reference ``HiRadixCache`` and the optimized twin (checked mode) under
SGLang 0.5.23's rules (``Rules.hicache_host_tier == "unified"``, ``tree_free == "segment"``),
driven in lockstep by the ``hiradix_cache`` machine (every ``INV-HOST-*`` invariant, the device
allocator's, tree shape and locks after every step; trees compared as the unified cache
reports them, ``coarse_host_tier``), with the unified host tier's paths, storage prefetches
included, in the coverage."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.hiradix import HiRadixTarget
from kvpool.testing.swarm import RandomChooser

UNIFIED = Rules.for_sglang("0.5.23")
REACHED = (
    "insert:write-issued", "writing_check:acked", "evict:to-host", "evict:freed",
    "match_prefix:host-hit", "load_back:loaded", "load_back:skipped", "loading_check:acked",
    "evict_host:freed", "host:duplicate-reclaimed", "prefetch:ok", "storage_hit:ok",
    "prefetch_io:ok", "drain_storage_control_queues:ok",
)  # fmt: skip


@pytest.mark.slow
def test_twin_and_reference_agree_under_the_unified_host_tier() -> None:
    reference = dataclasses.replace(reference_implementation(), rules=UNIFIED)
    twin = dataclasses.replace(optimized_implementation("torch", checked=True), rules=UNIFIED)
    result = run_machine("hiradix_cache", reference, twin, 1e9, seed=3, steps_per_run=60,
                         max_runs=40)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.steps == 40 * 60 and result.invariant_checks > result.steps
    missing = [t for t in REACHED if not result.coverage.get(t)]
    assert not missing, missing
    assert len(result.page_sizes) == 3


def test_storage_is_drawn_under_both_rules_with_the_same_draws() -> None:
    """Storage prefetches (0.5.23's flow under the unified rules: tests/reference/
    test_prefetch_unified.py) are drawn whenever the implementation runs them, the rest of the
    configuration drawn alike; an implementation that runs none (``hiradix_storage`` False) draws
    none."""
    import random

    target = HiRadixTarget()
    unified = dataclasses.replace(reference_implementation(), rules=UNIFIED)
    without = dataclasses.replace(unified, hiradix_storage=False)
    storage = 0
    for seed in range(60):
        plain = target.draw_config(RandomChooser(random.Random(seed)), reference_implementation())
        drawn = target.draw_config(RandomChooser(random.Random(seed)), unified)
        assert dataclasses.replace(drawn, rules=plain.rules) == plain
        assert not target.draw_config(RandomChooser(random.Random(seed)), without).hicache_storage
        storage += drawn.hicache_storage
    assert storage > 0

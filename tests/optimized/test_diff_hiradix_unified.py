"""Differential test: the reference ``HiRadixCache`` and the optimized twin (checked mode) under
SGLang 0.5.23's rules (``Rules.hicache_host_tier == "unified"``, ``tree_free == "segment"``),
driven in lockstep by the ``hiradix_cache`` machine (every ``INV-HOST-*`` invariant, the device
allocator's, tree shape and locks after every step; trees compared as the unified cache
reports them, ``coarse_host_tier``), with the unified host tier's paths in the coverage."""

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
    "evict_host:freed", "host:duplicate-reclaimed",
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


def test_the_unified_rules_draw_no_storage_and_the_default_draws_are_unchanged() -> None:
    import random

    target = HiRadixTarget()
    unified = dataclasses.replace(reference_implementation(), rules=UNIFIED)
    storage = 0
    for seed in range(60):
        plain_rng, unified_rng = random.Random(seed), random.Random(seed)
        plain = target.draw_config(RandomChooser(plain_rng), reference_implementation())
        drawn = target.draw_config(RandomChooser(unified_rng), unified)
        assert not drawn.hicache_storage  # storage prefetches are 0.5.16's flow
        storage += plain.hicache_storage
    assert storage > 0  # the default rules still draw it

"""The default campaign's coverage tags of allocations that must evict first.

A decode (or EAGLE v2 step) that finds the pool short of free slots evicts from the tree before
it allocates; SGLang's paged decode over-asks (a page per request). These paths are rare in
drawn states, so the manager machine tags them (``decode:evicted``, ``spec_step:evicted``: the
tree lost nodes during the step) and the catalogue lists them: ``kvpool verify`` then prints how
often a campaign reached them, and ``never`` when it did not."""

from __future__ import annotations

from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE


def test_a_seeded_campaign_reaches_allocations_that_evict_first() -> None:
    assert {"decode:evicted", "spec_step:evicted"} <= set(CATALOGUE["manager"])
    result = run_machine("manager", reference_implementation(), optimized_implementation(),
                         3600.0, seed=0, max_runs=60)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.coverage["decode:evicted"] > 0, result.coverage
    assert result.coverage["spec_step:evicted"] > 0, result.coverage
    assert result.coverage["decode:evicted"] < result.coverage["decode:ok"]

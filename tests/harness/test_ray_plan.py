"""The Ray driver's bookkeeping (no cluster needed): after a failure, the runs below it that a
block cut by the deadline skipped are run again; those above it never are."""

from __future__ import annotations

from kvpool.testing.ray_campaign import _Plan


def test_holes_below_the_lowest_failure_are_filled_and_clamped() -> None:
    plan = _Plan(next_run=40, holes=[(5, 8), (20, 24), (33, 40)])
    assert plan.take_hole() is None  # no failure yet: a cut block is just the deadline
    plan.failures[22] = ("crash", 1, "why", [], {})
    assert plan.stop_at == 22
    assert plan.take_hole() == (20, 22)  # (33, 40) is above the failure: dropped
    assert plan.take_hole() == (5, 8)
    assert plan.take_hole() is None

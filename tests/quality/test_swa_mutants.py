"""The SWA part of the quality suite: every seeded SWA bug of
:data:`tests.quality.mutants_swa.SWA_MUTANTS` is caught by its component machine
(``swa_allocator``, ``swa_radix_cache`` or ``swa_manager``), by one of the detectors it names,
within a fixed budget (40 seeded runs of 40 steps), with a shrunk trace of at most 20 steps; the
unmutated twin passes the same budget on each machine."""

from __future__ import annotations

import pytest

from kvpool.testing.quality import ComponentMutant, format_table, hunt_component
from tests.quality.mutants_swa import SWA_MUTANTS

FIELD_BUGS = 6
"""The issue's SWA field bugs (stale mapping, freed sentinel, lazy group resolution, window
slots leaked, window slots freed twice, a tombstone evicted under a full lock); the suite seeds
at least these."""


def test_enough_distinct_seeded_swa_bugs() -> None:
    names = [m.name for m in SWA_MUTANTS]
    assert len(set(names)) == len(names) >= FIELD_BUGS
    assert all(m.expected for m in SWA_MUTANTS)


@pytest.mark.slow
@pytest.mark.parametrize("component", ["swa_allocator", "swa_radix_cache", "swa_manager"])
def test_unmutated_twin_passes_the_same_budget(component: str) -> None:
    clean = ComponentMutant("no-bug", "control", ("none",), lambda obj: None, component)
    result = hunt_component(clean)
    assert not result.caught, result.report


@pytest.mark.slow
def test_every_seeded_swa_bug_is_caught_by_its_detector() -> None:
    results = [hunt_component(m) for m in SWA_MUTANTS]
    table = format_table(results)
    print("\n" + table)
    missed = [r.name for r in results if not r.caught]
    wrong = [f"{r.name} caught by {r.detector}, expected {r.expected}"
             for r in results if r.caught and not r.as_expected]  # fmt: skip
    assert not missed, f"not caught: {missed}\n{table}"
    assert not wrong, "\n".join(wrong) + "\n" + table
    assert all(r.shrunk_steps is not None and r.shrunk_steps <= 20 for r in results), table

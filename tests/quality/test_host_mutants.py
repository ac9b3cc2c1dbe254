"""The host-tier part of the quality suite: every seeded bug of
:data:`tests.quality.mutants_host.HOST_MUTANTS` is caught by the ``hiradix_cache`` machine, by
the detector it names, within a fixed budget (40 seeded runs of 40 steps), with a shrunk trace of
at most 20 steps; the unmutated twin passes the same budget."""

from __future__ import annotations

import pytest

from kvpool.testing.quality import ComponentMutant, format_table, hunt_component
from tests.quality.mutants_host import HOST_MUTANTS

FIELD_BUGS = 4
"""The host tier's field bugs: host pages released twice after a partial prefetch, device pages
not freed after a write-back acknowledgement, device KV evicted before its backup completed, a
load-back whose host pages were not pinned."""


def test_enough_distinct_seeded_host_bugs() -> None:
    names = [m.name for m in HOST_MUTANTS]
    assert len(set(names)) == len(names) >= FIELD_BUGS
    assert all(m.component == "hiradix_cache" and len(m.expected) == 1 for m in HOST_MUTANTS)


@pytest.mark.slow
def test_unmutated_twin_passes_the_same_budget() -> None:
    clean = ComponentMutant("no-bug", "control", ("none",), lambda obj: None, "hiradix_cache")
    result = hunt_component(clean)
    assert not result.caught, result.report


@pytest.mark.slow
def test_every_seeded_host_bug_is_caught_by_its_detector() -> None:
    results = [hunt_component(m) for m in HOST_MUTANTS]
    table = format_table(results)
    print("\n" + table)
    missed = [r.name for r in results if not r.caught]
    wrong = [f"{r.name} caught by {r.detector}, expected {r.expected}"
             for r in results if r.caught and not r.as_expected]  # fmt: skip
    assert not missed, f"not caught: {missed}\n{table}"
    assert not wrong, "\n".join(wrong) + "\n" + table
    assert all(r.shrunk_steps is not None and r.shrunk_steps <= 20 for r in results), table

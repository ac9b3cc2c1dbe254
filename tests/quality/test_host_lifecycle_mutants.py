"""The host tier's lifecycle bugs in the quality suite: every seeded bug of
:data:`tests.quality.mutants_host_lifecycle.HOST_LIFECYCLE_MUTANTS` is caught by the lifecycle
machine, by the detector it names, within the ``mutants`` budget, with a shrunk trace of at
most 20 steps; the unmutated twin passes the same runs."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvpool.testing.profiles import register_profiles
from kvpool.testing.quality import Mutant, format_table, hunt
from tests.quality.mutants_host_lifecycle import _HOST, _LOAD_BACK, HOST_LIFECYCLE_MUTANTS


def _budget() -> settings:
    register_profiles()
    return settings.get_profile("mutants")


@pytest.mark.slow
def test_unmutated_twin_passes_the_same_budget() -> None:
    clean = Mutant("no-bug", "control", ("none",), lambda manager: None, (1, 2), _HOST, _LOAD_BACK)
    result = hunt(clean, _budget())
    assert not result.caught, result.report


@pytest.mark.slow
def test_every_seeded_host_lifecycle_bug_is_caught_by_its_detector() -> None:
    results = [hunt(m, _budget()) for m in HOST_LIFECYCLE_MUTANTS]
    table = format_table(results)
    print("\n" + table)
    assert all(r.caught for r in results), table
    wrong = [f"{r.name} caught by {r.detector}" for r in results if not r.as_expected]
    assert not wrong, "\n".join(wrong) + "\n" + table
    assert all(r.shrunk_steps is not None and r.shrunk_steps <= 20 for r in results), table

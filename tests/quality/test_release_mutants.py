"""The seeded bugs of SGLang 0.5.23's release path
(:data:`tests.quality.mutants_release.RELEASE_MUTANTS`): each is caught by a detector it names
when both sides follow 0.5.23 (the lifecycle over the unified tree, chunks cached through
``checkpoint``), within the fixed, seeded budget of lifecycle runs, with a short trace; the
same bug is out of reach of a campaign under kvpool's own rules, which never call
``checkpoint``; the unmutated twin passes the budget."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.testing.quality import ImplementationMutant, format_table, hunt_implementation
from tests.quality.mutants_release import RELEASE_MUTANTS


@pytest.mark.slow
@pytest.mark.parametrize("mutant", RELEASE_MUTANTS, ids=lambda m: m.name)
def test_release_bug_is_caught_by_its_detector(mutant: ImplementationMutant) -> None:
    result = hunt_implementation(mutant)
    table = format_table([result])
    assert result.caught, f"not caught\n{table}"
    assert result.as_expected, f"caught by {result.detector}, expected {mutant.expected}\n{table}"
    assert result.shrunk_steps is not None and result.shrunk_steps <= 8, table


@pytest.mark.slow
@pytest.mark.parametrize("mutant", RELEASE_MUTANTS, ids=lambda m: m.name)
def test_kvpools_own_rules_never_reach_it(mutant: ImplementationMutant) -> None:
    """The same patch under kvpool's own rules: the release path it breaks is not taken."""
    own = dataclasses.replace(mutant, release=None)
    result = hunt_implementation(own)
    assert not result.caught, format_table([result])


@pytest.mark.slow
def test_unmutated_twin_passes_the_same_budget() -> None:
    budget = max(m.runs for m in RELEASE_MUTANTS)
    clean = ImplementationMutant("no-bug", "control", ("none",), lambda impl: impl, "manager",
                                 "0.5.23", runs=budget)  # fmt: skip
    result = hunt_implementation(clean)
    assert not result.caught, result.report

"""The Mamba seeded bugs (:data:`tests.quality.mutants_mamba.MAMBA_MUTANTS`: the four field bugs
and two of the Mamba radix cache) are each caught by a detector they name, within a fixed,
seeded budget of component-machine runs; the unmutated unchecked twin passes the same budget on
both machines."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvpool.testing.profiles import register_profiles
from kvpool.testing.quality import (
    ImplementationMutant,
    Mutant,
    format_table,
    hunt,
    hunt_implementation,
)
from tests.quality.mutants_mamba import MAMBA_LIFECYCLE_MUTANTS, MAMBA_MUTANTS

FIELD_BUGS = {
    "mamba-waiting-abort-leaks",
    "mamba-prefill-finish-keeps",
    "mamba-admit-asserts",
    "mamba-cow-shares-checkpoint",
}


def test_every_field_bug_is_seeded() -> None:
    assert {m.name for m in MAMBA_MUTANTS} >= FIELD_BUGS
    assert all(m.expected for m in MAMBA_MUTANTS)
    assert {m.component for m in MAMBA_MUTANTS} == {"hybrid_req_to_token_pool", "mamba_radix_cache"}


@pytest.mark.slow
@pytest.mark.parametrize("component", ["hybrid_req_to_token_pool", "mamba_radix_cache"])
def test_unmutated_twin_passes_the_same_budget(component: str) -> None:
    clean = ImplementationMutant("no-bug", "control", ("none",), lambda impl: impl, component)
    result = hunt_implementation(clean)
    assert not result.caught, result.report


@pytest.mark.parametrize("mutant", MAMBA_MUTANTS, ids=lambda m: m.name)
def test_field_bug_is_caught_by_its_detector(mutant: ImplementationMutant) -> None:
    result = hunt_implementation(mutant)
    table = format_table([result])
    assert result.caught, f"not caught\n{table}"
    assert result.as_expected, f"caught by {result.detector}, expected {mutant.expected}\n{table}"
    assert result.shrunk_steps is not None and result.shrunk_steps <= 12, table


def _budget() -> settings:
    register_profiles()
    return settings.get_profile("mutants")


@pytest.mark.slow
@pytest.mark.parametrize("mutant", MAMBA_LIFECYCLE_MUTANTS, ids=lambda m: m.name)
def test_lifecycle_mamba_bug_is_caught(mutant: Mutant) -> None:
    result = hunt(mutant, _budget())
    assert result.as_expected, format_table([result])


@pytest.mark.slow
@pytest.mark.parametrize("base", MAMBA_LIFECYCLE_MUTANTS, ids=lambda m: m.name)
def test_hybrid_lifecycle_control_passes(base: Mutant) -> None:
    """The unmutated twin passes each hunt's budget, with that hunt's operation kinds."""
    clean = Mutant("no-bug", "control", ("none",), lambda mm: None, base.page_sizes,
                   base.overrides, base.kinds)  # fmt: skip
    result = hunt(clean, _budget())
    assert not result.caught, result.report

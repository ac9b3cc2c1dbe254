"""The hybrid_req_to_token_pool machine: reference against the twin is clean and reaches every
tag of its coverage catalogue; runs are deterministic; the CLI accepts the component."""

from __future__ import annotations

import pytest

from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines import TARGETS
from kvpool.testing.machines.coverage import CATALOGUE

NAME = "hybrid_req_to_token_pool"


@pytest.mark.slow
def test_reference_against_twin_is_clean_and_covers_the_catalogue() -> None:
    result = run_machine(NAME, reference_implementation(), optimized_implementation(), 120.0,
                         seed=3, steps_per_run=60, max_runs=60)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    missed = [t for t in CATALOGUE[NAME] if not result.coverage.get(t)]
    assert not missed, missed
    # every step checks every invariant: on both sides, or once when their snapshots are equal
    assert result.invariant_checks > 5 * result.steps


def test_runs_are_deterministic() -> None:
    ref = reference_implementation()
    first = run_machine(NAME, ref, ref, 60.0, seed=5, max_runs=5)
    again = run_machine(NAME, ref, ref, 60.0, seed=5, max_runs=5)
    assert first.coverage == again.coverage and first.steps == again.steps


def test_registered_everywhere() -> None:
    from kvpool.cli.verify import COMPONENTS as CLI
    from kvpool.testing.bundle import COMPONENTS

    assert NAME in TARGETS and NAME in CLI and NAME in COMPONENTS
    assert reference_implementation().provides(NAME) and optimized_implementation().provides(NAME)


@pytest.mark.slow
def test_mamba_tree_machine_is_clean_and_covers_the_catalogue() -> None:
    tree = "mamba_radix_cache"
    result = run_machine(tree, reference_implementation(), optimized_implementation(), 120.0,
                         seed=1, steps_per_run=60, max_runs=60)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    missed = [t for t in CATALOGUE[tree] if not result.coverage.get(t)]
    assert not missed, missed
    assert tree in TARGETS and reference_implementation().provides(tree)

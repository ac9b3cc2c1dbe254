"""The KV storage and layer-loading part of the quality suite: each seeded bug of
:mod:`tests.quality.mutants_kv` is caught by a detector it names, within the ``mutants``
budget (storage bugs: the lifecycle machine) or eight seeds (layer loading); the unmutated twin
passes the same budgets."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvpool.testing.profiles import register_profiles
from kvpool.testing.quality import Mutant, format_table, hunt
from tests.quality.mutants_kv import (
    FP4_MHA,
    KV_STORAGE_MUTANTS,
    LAYER_FOCUS,
    LAYER_LOADING_MUTANTS,
    LAYERWISE,
    LAYERWISE_LIFECYCLE_MUTANTS,
    PAGE_MAJOR,
    LayerLoadingMutant,
    hunt_layer_loading,
)


def _budget() -> settings:
    register_profiles()
    return settings.get_profile("mutants")


@pytest.mark.parametrize("mutant", KV_STORAGE_MUTANTS, ids=lambda m: m.name)
def test_storage_bug_is_caught_by_its_detector(mutant: Mutant) -> None:
    result = hunt(mutant, _budget())
    table = format_table([result])
    assert result.caught, f"not caught\n{table}"
    assert result.as_expected, f"caught by {result.detector}, expected {mutant.expected}\n{table}"


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [FP4_MHA, PAGE_MAJOR], ids=["fp4", "page_major"])
def test_unmutated_variant_twin_passes_the_same_budget(overrides: dict[str, object]) -> None:
    clean = Mutant("no-bug", "control", ("none",), lambda manager: None, (1, 2, 4), overrides)
    result = hunt(clean, _budget())
    assert not result.caught, result.report


@pytest.mark.parametrize("mutant", LAYER_LOADING_MUTANTS, ids=lambda m: m.name)
def test_layer_loading_bug_is_caught(mutant: LayerLoadingMutant) -> None:
    violations = hunt_layer_loading(mutant)
    assert violations and "before its load" in violations[0], violations


def test_layer_loading_control_passes() -> None:
    assert hunt_layer_loading(None) == []


@pytest.mark.parametrize("mutant", LAYERWISE_LIFECYCLE_MUTANTS, ids=lambda m: m.name)
def test_layerwise_lifecycle_bug_is_caught_by_its_detector(mutant: Mutant) -> None:
    result = hunt(mutant, _budget())
    table = format_table([result])
    assert result.caught, f"not caught\n{table}"
    assert result.as_expected, f"caught by {result.detector}, expected {mutant.expected}\n{table}"
    assert "layer_read(" in result.report, result.report


@pytest.mark.slow
def test_unmutated_layerwise_lifecycle_passes_the_same_budget() -> None:
    clean = Mutant(
        "no-bug", "control", ("none",), lambda m: None, (1, 2, 4), LAYERWISE, LAYER_FOCUS
    )
    result = hunt(clean, _budget())
    assert not result.caught, result.report
    assert result.steps > 0

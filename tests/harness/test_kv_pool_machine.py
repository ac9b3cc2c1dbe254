"""The ``kv_pool`` component machine: reference against twin over every storage variant and the
layer-loading steps; a twin that reads a layer early, or stores wrong bytes, is caught."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from kvpool.testing.bundle import Implementation
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines import TARGETS
from kvpool.testing.machines.coverage import CATALOGUE
from kvpool.testing.runs import execute
from kvpool.testing.swarm import RandomChooser

RUNS, STEPS = 30, 40


def campaign(impl_b: Implementation, runs: int = RUNS) -> tuple[Counter[str], str | None]:
    """``runs`` seeded runs; the coverage reached and the first failure's detector."""
    impl_a = reference_implementation()
    coverage: Counter[str] = Counter()
    for run in range(runs):
        chooser = RandomChooser(random.Random(f"kv_pool/{run}"))
        config = TARGETS["kv_pool"].draw_config(chooser, impl_b)
        done = execute("kv_pool", impl_a, impl_b, config, chooser=chooser, steps=STEPS)
        coverage.update(done.coverage)
        if done.failure is not None:
            return coverage, done.failure.detector
    return coverage, None


@pytest.mark.slow
def test_twin_agrees_and_reaches_the_catalogue() -> None:
    coverage, failure = campaign(optimized_implementation("torch"))
    assert failure is None
    missing = [tag for tag in CATALOGUE["kv_pool"] if not coverage[tag]]
    assert not missing, (missing, coverage)


def _patched(patch: Callable[[Any], None]) -> Implementation:
    base = optimized_implementation("torch")
    build = base.kv_cache
    assert build is not None

    def mutated(config: Any) -> Any:
        pool = build(config)
        patch(pool)
        return pool

    return dataclasses.replace(base, label="mutant", kv_cache=mutated)


def _eager(pool: Any) -> None:
    original = pool.get_key_buffer

    def get_key_buffer(layer_id: int) -> Any:
        saved, pool.layer_transfer_counter = pool.layer_transfer_counter, None
        try:
            return original(layer_id)
        finally:
            pool.layer_transfer_counter = saved

    pool.get_key_buffer = get_key_buffer


def _wrong_scale(pool: Any) -> None:
    if not hasattr(pool, "k_scale_buffer"):
        return
    original = pool.set_kv_buffer

    def set_kv_buffer(layer_id: int, loc: Any, *args: Any, **kwargs: Any) -> None:
        original(layer_id, loc, *args, **kwargs)
        pool.k_scale_buffer[layer_id - pool.start_layer][loc] += 1

    pool.set_kv_buffer = set_kv_buffer


@pytest.mark.parametrize(
    ("patch", "detector"),
    [(_eager, "INV-LAYER-LOADED"), (_wrong_scale, "lockstep-diff")],
    ids=["read-skips-wait", "fp4-mxfp8-scale-plus-one"],
)
def test_machine_catches_a_broken_twin(patch: Callable[[Any], None], detector: str) -> None:
    _, failure = campaign(_patched(patch))
    assert failure == detector

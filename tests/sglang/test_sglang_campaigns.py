"""Opt-in (``--run-sglang-wheel``): every component campaign against SGLang's own classes passes
with no adapter translation beyond the documented ``Rules`` presets (kvpool/rules.py,
specs/fidelity.md): the allocator (its Triton kernels through the interpreter, and the naive
extend path), ReqToTokenPool and RadixCache of 0.5.16 and 0.5.23, driven by the component
machines in lockstep with kvpool's reference, in this process, seeded."""

from __future__ import annotations

import pytest

from kvpool.sglang import implementation
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE

pytestmark = pytest.mark.sglang_wheel

RUNS = 12
"""Seeded runs per campaign (60 steps each): a few seconds per component."""


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
@pytest.mark.parametrize(
    ("component", "naive"),
    [("allocator", False), ("allocator", True), ("req_to_token_pool", False),
     ("radix_cache", False)],
)  # fmt: skip
def test_component_campaign_against_sglang_passes(
    version: str, component: str, naive: bool
) -> None:
    candidate = implementation(version, naive_extend=naive)
    result = run_machine(component, reference_implementation(), candidate, seconds=3600.0,
                         seed=16, max_runs=RUNS)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60
    reached = [t for t in CATALOGUE[component] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE[component]) // 2, reached

"""Differential test: the reference SWA radix cache (over the reference SWA allocator) and the
optimized twin (checked mode), driven in lockstep by the ``swa_radix_cache`` component machine
(every ``INV-SWA-*`` invariant with the tree, both pools' allocator invariants, after every step),
and ``kvpool verify --component swa_radix_cache`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpool.cli import main
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE


@pytest.mark.slow
def test_lockstep_campaign_is_clean_and_reaches_every_tag() -> None:
    result = run_machine("swa_radix_cache", reference_implementation(),
                         optimized_implementation("torch", checked=True), 1e9, seed=5,
                         steps_per_run=60, max_runs=60)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.invariant_checks > result.steps >= 60 * 40
    missing = [t for t in CATALOGUE["swa_radix_cache"] if not result.coverage.get(t)]
    assert not missing, missing
    assert len(result.page_sizes) == 3


@pytest.mark.slow
def test_verify_component_swa_radix_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "verify.json"
    code = main(["verify", "--component", "swa_radix_cache", "--seconds", "2", "--seed", "1",
                 "--no-progress", "--workers", "0", "--report", str(report)])  # fmt: skip
    assert code == 0, capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["component"] == "swa_radix_cache" and data["failures"] == 0 and data["steps"] > 0

"""Differential test: the reference ``HiRadixCache`` (with its host pool) and the optimized twin
(checked mode), driven in lockstep by the ``hiradix_cache`` component machine (every
``INV-HOST-*`` invariant, the device allocator's invariants, tree shape and locks on the
on-device part, after every step), as a campaign and as a hypothesis TestCase, and ``kvpool
verify --component hiradix_cache`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpool.cli import main
from kvpool.testing.campaign import run_machine
from kvpool.testing.component_machine import make_component_test
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE

TestHiRadixTwin = make_component_test("hiradix_cache", optimized_implementation())
TestHiRadixTwin = pytest.mark.slow(TestHiRadixTwin)
"""The same machine as a hypothesis TestCase (the ``ci`` profile: deterministic)."""

RARE = {"dec_lock_ref:ok", "inc_lock_ref:ok"}
"""Tags a 40-run campaign may miss (a lock needs a match of a node still on device)."""


@pytest.mark.slow
def test_lockstep_campaign_is_clean_and_reaches_the_catalogue() -> None:
    result = run_machine("hiradix_cache", reference_implementation(),
                         optimized_implementation("torch", checked=True), 1e9, seed=5,
                         steps_per_run=60, max_runs=40)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.invariant_checks > result.steps >= 60 * 30
    missing = [t for t in CATALOGUE["hiradix_cache"] if not result.coverage.get(t)]
    assert set(missing) <= RARE, missing
    assert len(result.page_sizes) == 3


@pytest.mark.slow
def test_verify_component_hiradix_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "verify.json"
    code = main(["verify", "--component", "hiradix_cache", "--seconds", "2", "--seed", "1",
                 "--no-progress", "--workers", "0", "--report", str(report)])  # fmt: skip
    assert code == 0, capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["component"] == "hiradix_cache" and data["failures"] == 0 and data["steps"] > 0

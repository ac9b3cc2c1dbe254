"""Differential test: the reference SWA allocator and the optimized twin (checked mode), driven
in lockstep by the ``swa_allocator`` component machine (every ``INV-SWA-*`` invariant and both
pools' allocator invariants after every step), plus the twin's own unit behaviour and
``kvpool verify --component swa_allocator`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvpool.cli import main
from kvpool.errors import DoubleFreeError, InvalidArgumentError
from kvpool.optimized.pure_swa_allocator import PureSWATokenToKVPoolAllocator
from kvpool.optimized.swa_allocator import SWATokenToKVPoolAllocator
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE


def test_lockstep_campaign_is_clean_and_reaches_every_tag() -> None:
    result = run_machine("swa_allocator", reference_implementation(),
                         optimized_implementation("torch", checked=True), 1e9, seed=11,
                         steps_per_run=60, max_runs=40)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.steps >= 40 * 30 and result.invariant_checks > result.steps
    missing = [t for t in CATALOGUE["swa_allocator"] if not result.coverage.get(t)]
    assert not missing, missing
    assert len(result.page_sizes) == 4  # 1, 2, 4 and 16


def test_twin_unit_behaviour_matches_the_reference_examples() -> None:
    a = SWATokenToKVPoolAllocator(32, 16, 4, checked=True)
    t = torch.tensor
    full = a.alloc_extend(t([0]), [0], t([10]), [10], t([-1]), 10)
    assert full is not None and full.tolist() == list(range(4, 14))
    a.free_swa(full[:4])
    assert a.translate_loc_from_full_to_swa(full[:5]).tolist() == [0, 0, 0, 0, 8]
    a.free(full)
    assert a.full_available_size() == 32 and a.swa_available_size() == 16
    with pytest.raises(DoubleFreeError):
        a.free(full)
    b = SWATokenToKVPoolAllocator(8, 4, 1, checked=True)
    b.alloc(3)
    b.free_group_begin()
    b.free(t([2]))
    assert b.translate_loc_from_full_to_swa(t([2])).tolist() == [0]
    with pytest.raises(InvalidArgumentError):
        b.backup_state()
    b.free_group_end()
    assert b.snapshot().swa.free_pages == (4, 2)


def test_pure_swa_twin() -> None:
    a = PureSWATokenToKVPoolAllocator(6, checked=True)
    x = a.alloc(2)
    assert x is not None and x.tolist() == [1, 2]
    a.free(torch.tensor([0, 1]))
    assert a.available_size() == 5 and a.snapshot().pure


def test_verify_component_swa_allocator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "verify.json"
    code = main(["verify", "--component", "swa_allocator", "--seconds", "2", "--seed", "3",
                 "--no-progress", "--workers", "0", "--report", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(report.read_text())
    assert data["component"] == "swa_allocator" and data["failures"] == 0 and data["steps"] > 0

"""Differential test: the reference SWA allocator and the optimized twin (checked mode), driven
in lockstep by the ``swa_allocator`` component machine (every ``INV-SWA-*`` invariant and both
pools' allocator invariants after every step), plus the twin's own unit behaviour and
``kvpool verify --component swa_allocator`` end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kvpool.cli import main
from kvpool.errors import DoubleFreeError, InvalidArgumentError
from kvpool.invariants import check_swa_allocator
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.optimized.swa.pure_allocator import PureSWATokenToKVPoolAllocator
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator as ReferenceSWA
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE

CHECKED = TwinOptions.make(checked=True)


@pytest.mark.slow
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
    a = SWATokenToKVPoolAllocator(32, 16, 4, options=CHECKED)
    t = torch.tensor
    full = a.alloc_extend(t([0]), [0], t([10]), [10], t([-1]), 10)
    assert full is not None and full.tolist() == list(range(4, 14))
    a.free_swa(full[:4])
    assert a.translate_loc_from_full_to_swa(full[:5]).tolist() == [0, 0, 0, 0, 8]
    a.free(full)
    assert a.full_available_size() == 32 and a.swa_available_size() == 16
    with pytest.raises(DoubleFreeError):
        a.free(full)
    b = SWATokenToKVPoolAllocator(8, 4, 1, options=CHECKED)
    b.alloc(3)
    b.free_group_begin()
    b.free(t([2]))
    assert b.translate_loc_from_full_to_swa(t([2])).tolist() == [0]
    with pytest.raises(InvalidArgumentError):
        b.backup_state()
    b.free_group_end()
    assert b.snapshot().swa.free_pages == (4, 2)


def test_pure_swa_twin() -> None:
    a = PureSWATokenToKVPoolAllocator(6, options=CHECKED)
    x = a.alloc(2)
    assert x is not None and x.tolist() == [1, 2]
    a.free(torch.tensor([0, 1]))
    assert a.available_size() == 5 and a.snapshot().pure


@pytest.mark.slow
def test_verify_component_swa_allocator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "verify.json"
    code = main(["verify", "--component", "swa_allocator", "--seconds", "2", "--seed", "3",
                 "--no-progress", "--workers", "0", "--report", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(report.read_text())
    assert data["component"] == "swa_allocator" and data["failures"] == 0 and data["steps"] > 0


@pytest.mark.slow
def test_twins_agree_under_sglang_0_5_16_free_group_resolution() -> None:
    rules = Rules(swa_free_resolve="group_end")
    ref = replace(reference_implementation(), rules=rules)
    opt = replace(optimized_implementation("torch", checked=True), rules=rules)
    result = run_machine("swa_allocator", ref, opt, 1e9, seed=5, steps_per_run=60, max_runs=25)
    assert result.failure is None, result.failure and result.failure.report
    assert result.coverage.get("free:in-group") and result.coverage.get("free_swa:in-group")


@pytest.mark.parametrize("twin", ["reference", "optimized"])
def test_group_end_resolution_reads_the_entries_when_the_group_closes(twin: str) -> None:
    rules = Rules(swa_free_resolve="group_end")
    if twin == "reference":
        a: object = ReferenceSWA(8, 8, 1, rules=rules)
    else:
        a = SWATokenToKVPoolAllocator(8, 8, 1, options=CHECKED, rules=rules)
    x = [int(s) for s in a.alloc(3)]  # type: ignore[attr-defined]
    a.free_group_begin()  # type: ignore[attr-defined]
    a.free([x[0]])  # type: ignore[attr-defined]
    a.free_swa([x[1]])  # type: ignore[attr-defined]
    snap = a.snapshot()  # type: ignore[attr-defined]
    assert snap.resolves_at_group_end and snap.full.pending_free == (x[0],)
    assert snap.full_to_swa[x[0]] == x[0]  # still mapped while the group is open
    assert not snap.swa.in_free_group and snap.swa.free_pages[-1] == x[1]  # free_swa: at once
    check_swa_allocator(snap, set(x))  # the checker counts pending slots as held
    a.free_group_end()  # type: ignore[attr-defined]
    snap = a.snapshot()  # type: ignore[attr-defined]
    assert snap.full_to_swa[x[0]] == 0 and snap.swa.free_pages[-2:] == (x[1], x[0])
    check_swa_allocator(snap, {x[1], x[2]})


@pytest.mark.parametrize("page_size", [1, 2])
@pytest.mark.parametrize("twin", ["reference", "optimized"])
def test_group_end_free_full_frees_at_once_beside_the_open_group(twin: str, page_size: int) -> None:
    """SGLang 0.5.16's group is the SWA allocator's alone: its tree's direct full-pool free
    (a locked recovery's incoming slots) goes back at once, the buffered frees at the end."""
    rules = Rules(swa_free_resolve="group_end")
    ps = page_size
    if twin == "reference":
        a: object = ReferenceSWA(8 * ps, 8 * ps, ps, rules=rules)
    else:
        a = SWATokenToKVPoolAllocator(8 * ps, 8 * ps, ps, options=CHECKED, rules=rules)
    t = torch.tensor if twin == "optimized" else list
    n = 3 * ps
    got = (
        a.alloc(n)  # type: ignore[attr-defined]
        if ps == 1
        else a.alloc_extend(t([0]), [0], t([n]), [n], t([-1]), n)  # type: ignore[attr-defined]
    )
    x = [int(s) for s in got]

    def pages(slots: list[int]) -> set[int]:
        return {s // ps for s in slots}

    first, second, third = x[:ps], x[ps : 2 * ps], x[2 * ps :]
    a.free_group_begin()  # type: ignore[attr-defined]
    a.free(first)  # type: ignore[attr-defined]
    a.free_swa(second)  # type: ignore[attr-defined]
    a.free_full(second)  # type: ignore[attr-defined]
    snap = a.snapshot()  # type: ignore[attr-defined]
    page = second[0] // ps
    assert snap.full.in_free_group and snap.full.pending_free == tuple(first)
    assert page in snap.full.free_pages and first[0] // ps not in snap.full.free_pages
    check_swa_allocator(snap, pages(first + third))
    a.free_swa(first)  # type: ignore[attr-defined]
    with pytest.raises(DoubleFreeError):  # a slot the group holds, freed beside it
        a.free_full(first)  # type: ignore[attr-defined]
    a.free_group_end()  # type: ignore[attr-defined]
    snap = a.snapshot()  # type: ignore[attr-defined]
    assert not snap.full.in_free_group
    if ps > 1:  # a paged free puts its pages in front: the group's went back last
        assert snap.full.free_pages[:2] == (first[0] // ps, page)
    check_swa_allocator(snap, pages(third))

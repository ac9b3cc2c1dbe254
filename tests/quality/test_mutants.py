"""The quality suite: every seeded bug of :data:`tests.quality.mutants.MUTANTS` must be caught,
by one of the detectors it names, within the ``ci`` budget (the ``mutants`` profile: the same
examples and steps, deterministic, no hypothesis shrinking; the trace is shrunk by the harness).

Prints a table (kill rate, examples needed, shrunk trace length per bug) and writes it as JSON to
``$KVPOOL_QUALITY_REPORT`` or ``<tmp>/kvpool-quality.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from kvpool.testing.profiles import register_profiles
from kvpool.testing.quality import Mutant, format_table, hunt
from tests.quality.mutants import MUTANTS

SECTION_10_KINDS = 15
"""specs/sglang_behaviour.md, section 10, lists these bug kinds; the suite must seed at least
as many bugs."""


def _budget() -> settings:
    register_profiles()
    return settings.get_profile("mutants")


def test_enough_distinct_seeded_bugs() -> None:
    names = [m.name for m in MUTANTS]
    assert len(set(names)) == len(names) >= SECTION_10_KINDS
    assert all(m.expected for m in MUTANTS)


@pytest.mark.slow
def test_unmutated_twin_passes_the_same_budget() -> None:
    """No false alarm: the same runs on the unmutated (unchecked) twin find nothing."""
    clean = Mutant("no-bug", "control", ("none",), lambda manager: None, (1, 2, 4), stops=True)
    result = hunt(clean, _budget())
    assert not result.caught, result.report


@pytest.mark.slow
def test_every_seeded_bug_is_caught_by_its_detector() -> None:
    results = [hunt(m, _budget()) for m in MUTANTS]
    table = format_table(results)
    print("\n" + table)
    out = Path(
        os.environ.get("KVPOOL_QUALITY_REPORT", Path(tempfile.gettempdir()) / "kvpool-quality.json")
    )
    rows = [{k: v for k, v in dataclasses.asdict(r).items() if k != "report"} for r in results]
    out.write_text(
        json.dumps(
            {"mutants": rows, "kill_rate": sum(r.caught for r in results) / len(results)}, indent=2
        )
    )
    missed = [r.name for r in results if not r.caught]
    wrong = [
        f"{r.name} caught by {r.detector}, expected {r.expected}"
        for r in results
        if r.caught and not r.as_expected
    ]
    assert not missed, f"not caught: {missed}\n{table}"
    assert not wrong, "\n".join(wrong) + "\n" + table
    assert all(r.shrunk_steps is not None and r.shrunk_steps <= 20 for r in results), table

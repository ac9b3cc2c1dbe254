"""``benchmarks/bench_quality.py`` (``kvpool bench --only quality``): the seeded bugs' time-to-find,
with the deterministic columns that show a weaker verification."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_quality", BENCHMARKS / "bench_quality.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_row_per_bug_then_the_median() -> None:
    rows = _load().run(True, only="slot0-allocatable")
    assert [r["mutant"] for r in rows] == ["slot0-allocatable", "median"]
    bug = rows[0]
    assert bug["caught"] is True and bug["detector"] == "INV-RESERVED-ZERO"
    assert bug["examples"] >= 1 and bug["steps"] >= 1 and bug["find_s"] > 0
    assert rows[1]["find_s"] == bug["find_s"] and rows[1]["caught"] == 1


def test_main_refuses_a_name_that_matches_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load().main(["--only", "nosuchbug", "--rounds", "1"]) == 1
    assert "no seeded bug matches" in capsys.readouterr().err

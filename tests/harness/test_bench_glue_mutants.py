"""``benchmarks/bench_glue_mutants.py``: the kill ratio of SGLang's glue mutants. Without the
wheel: the summary counts (a function none of whose mutants is reached gets no row; the ratio is
over reached mutants; every verdict but ``survived`` and ``unreached`` is a kill). Opt-in
(``--run-sglang-wheel``): a short run over ``release_kv_cache``'s mutants."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load() -> ModuleType:
    path = BENCHMARKS / "bench_glue_mutants.py"
    spec = importlib.util.spec_from_file_location("bench_glue_mutants", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _row(function: str, verdict: str) -> dict[str, Any]:
    return {"mutant": f"{function}:1 SDL x", "function": function, "verdict": verdict}


def test_summary_counts_kills_over_reached_mutants() -> None:
    rows = [
        _row("common.a", "INV-LOCKS"),
        _row("common.a", "survived"),
        _row("common.a", "unreached"),
        _row("common.a", "killed by signal SIGSEGV"),
        _row("common.b", "unreached"),
        _row("allocation.c", "hung"),
    ]
    table = {r["function"]: r for r in _load().summary(rows)}
    assert list(table) == ["allocation.c", "common.a", "total"]  # common.b: nothing reached
    assert table["common.a"] == {"function": "common.a", "mutants": 4, "reached": 3,
                                 "killed": 2, "survived": 1, "kill_ratio": 0.667}  # fmt: skip
    assert table["total"]["mutants"] == 6 and table["total"]["reached"] == 4
    assert table["total"]["killed"] == 3 and table["total"]["kill_ratio"] == 0.75


@pytest.mark.sglang_wheel
def test_release_mutants_mostly_killed() -> None:
    rows, _ = _load().verdicts("0.5.23", ["manager"], 1, 20, 2, 600.0, "release_kv_cache")
    verdicts = {r["mutant"]: r["verdict"] for r in rows}
    unlock = next(v for name, v in verdicts.items() if "delete tree_cache.unlock" in name)
    assert unlock == "INV-LOCKS"
    reached = [v for v in verdicts.values() if v != "unreached"]
    killed = [v for v in reached if v != "survived"]
    assert len(reached) >= 10 and len(killed) >= len(reached) * 0.7, verdicts

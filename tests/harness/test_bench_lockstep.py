"""``benchmarks/bench_lockstep.py`` (``kvpool bench --only lockstep``): one row per machine with
its lockstep steps per second, and the two-worker row of the default campaign;
``benchmarks/bench_crash_shrink.py`` (``kvpool bench --only crash``): a candidate that kills its
process found, shrunk, and its replays counted; and (opt-in, SGLang's wheel)
``benchmarks/bench_sessions.py``: ``kvpool sessions``' plans on both allocation paths."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kvpool.testing.machines import TARGETS

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_run_all_finds_the_lockstep_benchmark() -> None:
    assert "bench_lockstep" in _load("run_all").discover("lockstep")


def test_a_machine_row_counts_steps_checks_and_speed() -> None:
    row = _load("bench_lockstep").machine_row("allocator", runs=1)
    assert row["machine"] == "allocator"
    assert (row["runs"], row["steps"], row["failures"]) == (1, 60, 0)
    assert row["checks"] > row["steps"]  # every step checks every invariant on both sides
    assert row["steps_per_s"] is None or row["steps_per_s"] > 0


def test_a_row_against_a_named_candidate_says_which() -> None:
    """``--impl SPEC`` (an implementation spec, as ``kvpool verify --impl``): the rows run
    that candidate and name it; the default candidate's rows keep the machine's name."""
    bench = _load("bench_lockstep")
    row = bench.machine_row("req_to_token_pool", runs=1, impl="reference")
    assert row["machine"] == "req_to_token_pool vs reference"
    assert (row["runs"], row["steps"], row["failures"]) == (1, 60, 0)
    assert bench.machine_row("req_to_token_pool", runs=1, impl=bench.TWIN)["machine"] == (
        "req_to_token_pool"
    )
    with pytest.raises(ValueError, match="unknown kernel backend"):
        bench.machine_row("req_to_token_pool", runs=1, impl="optimized[nosuch]")


def test_only_selects_machines_by_name() -> None:
    rows = _load("bench_lockstep").run(True, only="radix_cache", runs=1)
    names = [r["machine"] for r in rows]
    assert names == [n for n in TARGETS if "radix_cache" in n]
    assert "manager --workers 2" not in names


def test_main_prints_one_line_per_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("bench_lockstep").main(["--only", "req_to_token_pool", "--runs", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["machine", "runs"] and "steps_per_s" in out[0]
    assert [line.split()[0] for line in out[1:]] == [
        "req_to_token_pool",
        "hybrid_req_to_token_pool",
    ]


def test_main_refuses_a_name_that_matches_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("bench_lockstep").main(["--only", "nosuchmachine", "--runs", "1"]) == 1
    assert "no machine matches" in capsys.readouterr().err


def test_a_lifecycle_row_splits_its_step_time_into_parts() -> None:
    bench = _load("bench_lockstep")
    row = bench.machine_row("manager", runs=1)
    parts = [row[f"us_{p}"] for p in (*bench.SPLIT, "rest")]
    assert all(isinstance(v, int) and v >= 0 for v in parts), row
    assert row["us_call_a"] > 0 and row["us_snap_b"] > 0 and row["us_inv"] > 0
    total_us = row["cpu_s"] * 1e6 / row["steps"]
    assert abs(sum(parts) - total_us) <= 0.02 * total_us + 200, (parts, total_us)
    component = bench.machine_row("allocator", runs=1)
    assert all(component[f"us_{p}"] is None for p in (*bench.SPLIT, "rest"))


def test_a_reuse_row_measures_the_reference_snapshots_that_changed_nothing() -> None:
    bench = _load("bench_lockstep")
    row = bench.reuse_row("manager", runs=2)
    assert (row["machine"], row["steps"]) == ("manager", 120)
    assert 0 < row["kept_pct"] < 100  # some steps change the state, some (refusals) do not
    assert row["swa"] == "-" and isinstance(row["allocator"], int)
    assert all(row[p] == "-" or 0 <= row[p] <= 100 for p in bench.PARTS)
    assert 0 < row["us_snap_a_kept"] < row["us_snap_a"] and row["us_inv"] > 0


def test_main_reuse_prints_the_lifecycle_machines(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("bench_lockstep").main(["--reuse", "--only", "swa", "--runs", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["machine", "steps", "kept_pct"]
    assert [line.split()[0] for line in out[1:]] == ["swa_manager"]


@pytest.mark.slow
def test_the_crash_benchmarks_quick_row_is_the_first_steps_segfault_shrunk() -> None:
    from kvpool.testing import workers

    replay = workers.Replayer.__call__
    (row,) = _load("bench_crash_shrink").run(True)
    assert workers.Replayer.__call__ is replay  # the counter is taken off again
    assert (row["candidate"], row["machine"], row["detector"]) == ("crashy", "allocator", "crash")
    assert (row["found_at"], row["steps"]) == (0, 1)
    assert row["replays"] >= 1 and row["wall_s"] > 0


@pytest.mark.sglang_wheel
def test_the_sessions_benchmark_plays_the_same_plans_on_both_allocation_paths() -> None:
    torch_row, triton_row, ratio = _load("bench_sessions").run(True, runs=40)
    assert (torch_row["kernels"], triton_row["kernels"]) == ("torch", "triton (interpreter)")
    same = ("plans", "turns", "known", "failures")
    assert [torch_row[k] for k in same] == [triton_row[k] for k in same]
    assert torch_row["plans"] == 40 and torch_row["failures"] == 0
    assert ratio["kernels"] == "torch / triton" and ratio["plans_per_s"] is not None

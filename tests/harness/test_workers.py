"""Campaigns in worker processes: a candidate that segfaults or hangs is a reported, shrunk
``crash`` failure; a broken initial state is a failure like any other; the JSON report is
always written; the same seed gives the same trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpool.cli import main
from kvpool.testing.swarm import Op
from kvpool.testing.workers import CampaignSpec, Replayer, run_parallel

LABELS = ("reference", "candidate")


def _spec(impl: str, component: str = "allocator", seed: int = 0) -> CampaignSpec:
    return CampaignSpec(component, "reference", f"tests.harness.crashy_impl:{impl}", seed, 30,
                        LABELS)  # fmt: skip


@pytest.mark.slow
def test_a_segfault_is_a_shrunk_crash_with_the_signal() -> None:
    result = run_parallel(_spec("crashy"), 20.0, 2, step_timeout=30.0, shrink_budget=60.0)
    assert result.failure is not None
    assert result.failure.detector == "crash"
    assert "SIGSEGV" in result.failure.report
    assert len(result.failure.ops) <= 3, result.failure.ops
    assert any(op.startswith(("alloc(", "extend(")) for op in result.failure.ops)


@pytest.mark.slow
def test_a_crash_deep_in_a_lifecycle_run_is_shrunk() -> None:
    """The twin's eviction kills its process once a request has finished into the tree: a
    crash several operations into a run of the ``manager`` machine, shrunk to the operations
    that lead to it (a request in, prefilled into the tree, then the eviction)."""
    spec = _spec("crashy_manager", component="manager")
    result = run_parallel(spec, 30.0, 2, step_timeout=30.0, shrink_budget=120.0)
    assert result.failure is not None and result.failure.detector == "crash"
    assert "killed by signal SIGSEGV" in result.failure.report
    ops = result.failure.ops
    assert ops[-1].startswith("evict(") and any(op.startswith("extend(") for op in ops), ops
    assert 3 <= len(ops) <= 8, ops


@pytest.mark.slow
def test_replays_that_kill_their_process_are_forks_of_one_sandbox() -> None:
    """Shrinking replays many candidates that crash: each is a forked child of one sandbox
    (which imported both sides once), not a fresh interpreter."""
    replayer = Replayer(_spec("crashy"), 0, step_timeout=30.0)
    try:
        assert replayer([Op("alloc", (12,))]) == ("crash", 1)  # 3 pages of 4: the candidate dies
        assert "killed by signal SIGSEGV" in replayer.last_text
        sandbox = replayer.sandbox
        assert replayer([Op("alloc", (4,)), Op("alloc", (12,))]) == ("crash", 2)
        assert replayer([Op("alloc", (4,))]) is None
        assert replayer.sandbox is sandbox is not None
    finally:
        replayer.close()
    assert replayer.sandbox is None


@pytest.mark.slow
def test_a_worker_gives_torch_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers are the parallelism: torch in each gets one intra-op thread, whatever the
    parent's environment asks (a candidate that does not set it, SGLang's classes, ran
    several times slower on two workers); ``spec.env`` may still ask for more."""
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    result = run_parallel(_spec("one_thread_only"), 1.0, 1, step_timeout=30.0)
    assert result.failure is None, result.failure and result.failure.report
    assert result.steps > 0
    more = CampaignSpec("allocator", "reference", "tests.harness.crashy_impl:one_thread_only", 0,
                        30, LABELS, env=(("OMP_NUM_THREADS", "2"),))  # fmt: skip
    refused = run_parallel(more, 1.0, 1, step_timeout=30.0, shrink_budget=1.0)
    assert refused.failure is not None and refused.failure.detector == "crash"
    assert "2 intra-op threads" in refused.failure.report


@pytest.mark.slow
def test_a_hung_step_is_a_crash_named_by_the_timeout() -> None:
    result = run_parallel(_spec("hangy"), 20.0, 1, step_timeout=1.5, shrink_budget=30.0)
    assert result.failure is not None and result.failure.detector == "crash"
    assert "hung" in result.failure.report


@pytest.mark.slow
def test_same_seed_same_failure_with_two_workers() -> None:
    first = run_parallel(_spec("crashy", seed=5), 20.0, 2, step_timeout=30.0)
    second = run_parallel(_spec("crashy", seed=5), 20.0, 2, step_timeout=30.0)
    assert first.failure is not None and second.failure is not None
    assert (first.failure.run, first.failure.ops) == (second.failure.run, second.failure.ops)


@pytest.mark.slow
def test_verify_reports_a_broken_initial_state_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = main(["verify", "--seconds", "5", "--component", "allocator", "--workers", "1",
                 "--impl", "tests.harness.crashy_impl:born_broken", "--no-progress",
                 "--report", str(out)])  # fmt: skip
    assert code == 1
    payload = json.loads(out.read_text())
    assert payload["failure"]["detector"].startswith("INV-")
    assert payload["failure"]["ops"] == []
    assert payload["component"] == "allocator"


@pytest.mark.slow
def test_verify_writes_json_after_a_crash(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = main(["verify", "--seconds", "5", "--component", "allocator", "--workers", "1",
                 "--impl", "tests.harness.crashy_impl:crashy", "--no-progress",
                 "--report", str(out)])  # fmt: skip
    assert code == 1
    payload = json.loads(out.read_text())
    assert payload["failure"]["detector"] == "crash"
    assert "coverage" in payload and payload["workers"] == 1


@pytest.mark.slow
def test_interpret_lets_a_module_level_triton_kernel_run_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # workers inherit the environment: another test in this process may have left the switch on
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = ["verify", "--seconds", "3", "--component", "allocator", "--workers", "1",
            "--impl", "tests.harness.triton_candidate:kernel_candidate", "--no-progress",
            "--steps-per-run", "20"]  # fmt: skip
    out = tmp_path / "r.json"
    assert main([*args, "--interpret", "--report", str(out)]) == 0
    assert json.loads(out.read_text())["steps"] > 0
    # without the interpreter the compiled kernel cannot run on CPU tensors: a reported failure
    assert main([*args, "--report", str(out)]) == 1
    assert json.loads(out.read_text())["failure"]["detector"] == "crash"


@pytest.mark.slow
def test_checked_runs_the_candidate_kernels_under_the_checked_interpreter(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = main(["verify", "--seconds", "3", "--component", "allocator", "--workers", "1",
                 "--impl", "tests.harness.triton_candidate:kernel_candidate", "--checked",
                 "--no-progress", "--steps-per-run", "20", "--report", str(out)])  # fmt: skip
    assert code == 0, out.read_text()


def test_a_campaign_bar_shows_seconds_of_the_budget_and_the_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kvpool.testing.progress import CampaignBar

    bar = CampaignBar(10.0, "sessions", "plans")
    bar.update(2.5, 40)
    assert (bar.bar.n, bar.bar.total) == (2.5, 10.0)
    bar.update(12.0, 90)  # never past the budget
    assert bar.bar.n == 10.0
    bar.close()
    err = capsys.readouterr().err
    assert "sessions" in err and "90 plans" in err and "10.0/10.0s" in err


def test_what_a_candidate_logs_is_counted_not_printed(capfd: pytest.CaptureFixture[str]) -> None:
    """A worker counts the log records of the implementations it runs (coverage tags
    ``log:...``) instead of letting them reach stderr, and ``kvpool verify`` lists them."""
    from kvpool.testing.verify_run import coverage_lines
    from kvpool.testing.workers import LOG_TAG

    result = run_parallel(_spec("noisy"), 3600.0, 1, max_runs=3)
    assert result.failures == 0
    tag = f"{LOG_TAG}WARNING pool: asked for %d slots"
    assert result.coverage.get(tag, 0) > 0, result.coverage
    assert "asked for" not in capfd.readouterr().err
    lines = coverage_lines("allocator", result.coverage)
    assert "  logged by the implementations (records):" in lines
    assert f"    {result.coverage[tag]:>7}  WARNING pool: asked for %d slots" in lines


def test_an_in_process_verify_counts_the_logs_too(capfd: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", "--seconds", "1", "--component", "allocator", "--workers", "0",
                 "--impl", "tests.harness.crashy_impl:noisy", "--no-progress"])  # fmt: skip
    assert code == 0
    out, err = capfd.readouterr()
    assert "asked for" not in err
    assert "logged by the implementations (records):" in out
    assert "WARNING pool: asked for %d slots" in out

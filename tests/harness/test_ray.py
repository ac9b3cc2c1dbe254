"""``kvpool verify --ray``: a campaign fanned out over a local Ray cluster (2 CPUs, started
once for the module) gives the local campaign's results: the same lowest failing run and trace
for a candidate that segfaults, the same totals for a clean one; a Ray worker that dies is a
``crash`` with its run and checkpointed ops; the report has a ``ray`` section."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli import main
from kvpool.testing.campaign import CampaignFailure
from kvpool.testing.workers import CampaignSpec, run_parallel

ray: Any = pytest.importorskip("ray")

from kvpool.testing.ray_campaign import run_ray  # noqa: E402
from kvpool.testing.ray_connect import Connection, connect  # noqa: E402

LABELS = ("reference", "candidate")
# Budgets are generous on purpose: a campaign that finds its crash stops there, and under a
# loaded machine the workers' start-up alone can take most of a short budget.


def _spec(impl: str, seed: int = 0) -> CampaignSpec:
    return CampaignSpec("allocator", "reference", impl, seed, 30, LABELS)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Connection]:
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield connect("auto")  # reuses this process's connection
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def local_crash() -> CampaignFailure:
    """The failure the local campaign (one worker process) reports for ``crashy``."""
    local = run_parallel(_spec("tests.harness.crashy_impl:crashy"), 120.0, 1, step_timeout=30.0)
    assert local.failure is not None
    return local.failure


@pytest.mark.slow
def test_a_segfault_on_the_cluster_is_the_local_crash(
    cluster: Connection, local_crash: CampaignFailure, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    code = main(["verify", "--ray", "--seconds", "120", "--component", "allocator",
                 "--impl", "tests.harness.crashy_impl:crashy", "--steps-per-run", "30",
                 "--no-progress", "--report", str(out)])  # fmt: skip
    assert code == 1
    payload = json.loads(out.read_text())
    failure = payload["failure"]
    assert failure["detector"] == "crash" and "SIGSEGV" in failure["report"]
    assert f"(run {failure['run']}, seed 0)" in failure["report"]
    assert failure["ops"] and any(op.startswith("alloc(") for op in failure["ops"])
    assert payload["ray"]["address"] == "auto" and payload["ray"]["tasks"] >= 1
    assert payload["failures"] == 1 and "coverage" in payload
    assert (local_crash.run, local_crash.ops) == (failure["run"], failure["ops"])


@pytest.mark.slow
def test_a_clean_candidate_merges_totals_equal_to_the_local_runs(cluster: Connection) -> None:
    spec = _spec("reference", seed=3)
    remote, info = run_ray(spec, 60.0, cluster, max_runs=12)
    local = run_parallel(spec, 60.0, 1, max_runs=12)
    assert remote.failure is None and info["tasks"] == 2  # runs 0-7 and 8-11
    assert remote.configurations == local.configurations == 12
    assert (remote.steps, remote.invariant_checks) == (local.steps, local.invariant_checks)
    assert remote.coverage == local.coverage and remote.page_sizes == local.page_sizes


@pytest.mark.slow
def test_a_dead_ray_worker_is_a_crash_with_its_run_and_ops(
    cluster: Connection, local_crash: CampaignFailure
) -> None:
    result, _ = run_ray(_spec("tests.harness.crashy_impl:ray_killer"), 120.0, cluster,
                        shrink_budget=5.0)  # fmt: skip
    failure = result.failure
    assert failure is not None and failure.detector == "crash", result
    assert failure.run == local_crash.run, failure  # the first 3-page allocation
    assert "Ray worker running it died" in failure.report, failure.report
    assert "seed 0" in failure.report
    # the checkpoint holds every op announced before the worker died, the fatal one last
    assert failure.ops and failure.ops[-1] == local_crash.ops[-1], (failure.ops, local_crash)

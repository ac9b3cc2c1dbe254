"""Scale-out: a failure found by one run is stored in a shared example database (a directory
on shared storage) and replayed by another process that only reads that database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.scaleout_case import run

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_failure_found_once_replays_in_another_process(tmp_path: Path) -> None:
    db = tmp_path / "shared-examples"
    first = run(db, "generate")
    assert first["detector"] is not None, "the leaky implementation must be caught"
    assert any(db.rglob("*")), "the failing example was saved to the shared database"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.harness.scaleout_case", str(db), "reuse"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=240, check=True,
    )  # fmt: skip
    second = json.loads(proc.stdout.strip().splitlines()[-1])
    assert second["detector"] == first["detector"]
    assert second["examples"] <= 3, "replayed from the database, not searched for again"


def test_empty_database_replays_nothing(tmp_path: Path) -> None:
    assert run(tmp_path / "empty", "reuse") == {"detector": None, "examples": 0}

"""``benchmarks/bench_crash_shrink.py`` (``kvpool bench --only crash``): a candidate that kills
its process found, shrunk, and its replays counted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_crash_shrink", BENCHMARKS / "bench_crash_shrink.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_quick_row_is_the_first_steps_segfault_shrunk() -> None:
    from kvpool.testing import workers

    replay = workers.Replayer.__call__
    (row,) = _load().run(True)
    assert workers.Replayer.__call__ is replay  # the counter is taken off again
    assert (row["candidate"], row["machine"], row["detector"]) == ("crashy", "allocator", "crash")
    assert (row["found_at"], row["steps"]) == (0, 1)
    assert row["replays"] >= 1 and row["wall_s"] > 0

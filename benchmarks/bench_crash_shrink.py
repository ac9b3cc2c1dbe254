"""Crash shrinking speed: a candidate that kills or hangs its process, found and shrunk.

A campaign that meets a candidate killing its worker process (a segfault in a kernel) or
hanging it must replay smaller and smaller op lists to shrink the trace, and most of those
replays kill their process again. Each row runs ``kvpool verify``'s campaign
(:func:`kvpool.testing.workers.run_parallel`, 2 workers, seed 0, 60 steps a run) against one
breaking candidate of ``tests/harness/crashy_impl.py`` until its failure is found and shrunk:

- ``crashy_manager`` (the ``manager`` machine): the torch twin whose eviction segfaults once
  the tree holds something, a few operations into a run;
- ``crashy`` (``allocator``): an allocation of 3 pages segfaults, at the first step;
- ``hangy`` (``allocator``, step timeout 1.5 s): the same allocation sleeps for an hour.

Columns: ``wall_s`` (from the call to the shrunk report, worker start-up included),
``replays`` (op lists the shrinker played: deterministic for one tree), ``replays_per_s``
(replays over the wall time: the replays dominate it), ``steps`` (the shrunk trace's length)
and ``found_at`` (the run that failed).

    python benchmarks/bench_crash_shrink.py [--quick]
    kvpool bench --only crash
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run_all, whoever loads us
from run_all import format_table

ROOT = Path(__file__).resolve().parent.parent
"""The repository: ``tests.harness.crashy_impl`` is imported from it (by the workers too,
which start with this process's ``sys.path``)."""

CASES = (
    ("crashy_manager", "manager", 30.0),
    ("crashy", "allocator", 30.0),
    ("hangy", "allocator", 1.5),
)
"""(candidate in ``tests/harness/crashy_impl.py``, machine, step timeout in seconds)."""


def crash_row(candidate: str, component: str, step_timeout: float) -> dict[str, Any]:
    """Find and shrink ``candidate``'s failure; its row (see the module docstring)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from kvpool.testing import workers
    from kvpool.testing.swarm import Op

    replays = 0
    replay = workers.Replayer.__call__

    def counted(self: workers.Replayer, ops: Sequence[Op]) -> tuple[str, int] | None:
        nonlocal replays
        replays += 1
        return replay(self, ops)

    spec = workers.CampaignSpec(component, "reference", f"tests.harness.crashy_impl:{candidate}",
                                0, 60, ("reference", candidate))  # fmt: skip
    workers.Replayer.__call__ = counted  # type: ignore[method-assign]
    try:
        start = time.monotonic()
        result = workers.run_parallel(spec, 60.0, 2, step_timeout=step_timeout,
                                      shrink_budget=120.0)  # fmt: skip
        wall = time.monotonic() - start
    finally:
        workers.Replayer.__call__ = replay  # type: ignore[method-assign]
    failure = result.failure
    return {
        "candidate": candidate,
        "machine": component,
        "detector": failure.detector if failure is not None else "none",
        "found_at": failure.run if failure is not None else None,
        "steps": len(failure.ops) if failure is not None else None,
        "replays": replays,
        "wall_s": round(wall, 1),
        "replays_per_s": round(replays / wall, 1) if wall > 0 else None,
    }


def run(quick: bool) -> list[dict[str, Any]]:
    """One row per case (``quick``: the first step's segfault only)."""
    cases = CASES[1:2] if quick else CASES
    return [crash_row(*case) for case in cases]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the allocator's segfault only")
    args = parser.parse_args(argv)
    print(format_table(run(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

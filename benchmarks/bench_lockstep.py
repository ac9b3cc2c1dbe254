"""Lockstep verification speed: steps per second of every machine of ``kvpool verify``.

One row per machine (:data:`kvpool.testing.machines.TARGETS`: ``manager``, the default
campaign's, then each component machine): the reference against the torch twin (checked mode,
torch fallbacks), a fixed number of runs of the campaign seeded 0 (run ``i`` draws its
configuration and 60 operations from ``random.Random(f"0/{i}")``, as ``kvpool verify`` does), in
this process on one thread, after one warm-up run of another seed. Every step runs the op on both
sides, compares results and snapshots and checks every invariant, as in a campaign. Columns:
``steps`` and ``checks`` (invariant checks run: equal from run to run for one tree, so a change
that skips a check shows here), ``cpu_s`` (CPU time of this thread: on a machine shared with
other jobs wall time would count their slices) and ``steps_per_s`` (``steps / cpu_s``, one
core), then where a step's CPU time went, in microseconds per step: ``us_call_a`` / ``us_call_b``
(the operation on the reference / the candidate), ``us_snap_a`` / ``us_snap_b`` (building their
snapshots), ``us_inv`` (the invariants) and ``us_rest`` (drawing the op, comparing results and
snapshots, building each run's pair, the collector; the lifecycle machines only: a component
machine's row leaves them blank). The last row, ``manager --workers 2``,
is ``kvpool verify``'s default campaign itself: two worker processes for ``--seconds`` of
wall time, steps per wall second.

``--impl SPEC`` runs every row against another candidate (an implementation spec, as
``kvpool verify --impl`` takes; rows then read ``MACHINE vs SPEC``): ``--impl sglang:0.5.23``
is ``kvpool verify --sglang 0.5.23``'s campaign, SGLang's own classes and scheduler glue loaded
from its wheel in the same run (``+naive``: its allocators' torch path).

``--reuse`` prints instead, for the four lifecycle machines, how often each part of the
reference's snapshot came out equal to the step before and how much of the reference's snapshot
time went on steps that changed nothing (:func:`reuse_row`): the room for a trusted oracle that
hands back its unchanged parts instead of reading them again.

    python benchmarks/bench_lockstep.py [--quick] [--only manager] [--runs 20] [--seconds 10]
    python benchmarks/bench_lockstep.py --only manager --impl sglang:0.5.23+naive --runs 100
    python benchmarks/bench_lockstep.py --reuse [--runs 200]
    kvpool bench --only lockstep
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run_all, whoever loads us
from run_all import format_table

STEPS_PER_RUN = 60
"""Operations per run (``kvpool verify``'s default)."""
TWIN = "optimized[torch]"
"""The default candidate: the torch twin in checked mode."""


@contextlib.contextmanager
def step_split() -> Iterator[Counter[str]]:
    """Thread CPU nanoseconds spent, while inside, in each part of a lockstep step (the
    driver's own methods, timed around; restored on leaving)."""
    from kvpool.testing.lockstep_driver import Lockstep

    spent: Counter[str] = Counter()
    saved = {name: getattr(Lockstep, name) for name in ("_call", "_snapshot", "_check")}

    def timed(name: str, part: Callable[[Lockstep, tuple[Any, ...]], str]) -> Any:
        inner = saved[name]

        def wrapper(self: Lockstep, *args: Any) -> Any:
            start = time.thread_time_ns()
            try:
                return inner(self, *args)
            finally:
                spent[part(self, args)] += time.thread_time_ns() - start

        return wrapper

    Lockstep._call = timed("_call", lambda d, a: "call_a" if a[1] is d.a else "call_b")  # type: ignore[method-assign]
    Lockstep._snapshot = timed("_snapshot", lambda d, a: "snap_a" if a[1] == 0 else "snap_b")  # type: ignore[method-assign]
    Lockstep._check = timed("_check", lambda d, a: "inv")  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        for name, method in saved.items():
            setattr(Lockstep, name, method)


SPLIT = ("call_a", "call_b", "snap_a", "snap_b", "inv")
"""The parts of :func:`step_split`, in column order (``rest`` follows)."""


def machine_row(component: str, runs: int, seed: int = 0, impl: str = TWIN) -> dict[str, Any]:
    """Run ``runs`` runs of ``component`` in this process against the candidate ``impl`` (an
    implementation spec, as ``kvpool verify --impl`` takes); its row (see the module
    docstring)."""
    import torch

    from kvpool.testing.campaign import quiet_collector, run_machine
    from kvpool.testing.implementations import reference_implementation, resolve_implementation

    torch.set_num_threads(1)
    ref, twin = reference_implementation(), resolve_implementation(impl, component)
    run_machine(component, ref, twin, 1e9, seed=seed + 1000, steps_per_run=STEPS_PER_RUN,
                max_runs=1)  # fmt: skip
    with quiet_collector(), step_split() as spent:  # as kvpool verify's workers run
        start = time.thread_time()
        result = run_machine(component, ref, twin, 1e9, seed=seed, steps_per_run=STEPS_PER_RUN,
                             max_runs=runs)  # fmt: skip
        cpu = time.thread_time() - start
    # ns of the whole campaign -> us per step; component machines step through their own
    # driver (kvpool.testing.machines.base), which the split does not time: blank columns
    per_step = 1e-3 / max(result.steps, 1)
    timed = sum(spent[part] for part in SPLIT)
    split: dict[str, int | None] = {
        f"us_{part}": round(spent[part] * per_step) if timed else None for part in SPLIT
    }
    split["us_rest"] = round((cpu * 1e9 - timed) * per_step) if timed else None
    return {
        "machine": component if impl == TWIN else f"{component} vs {impl}",
        "runs": result.configurations,
        "steps": result.steps,
        "checks": result.invariant_checks,
        "failures": result.failures,
        "cpu_s": round(cpu, 2),
        "steps_per_s": round(result.steps / cpu) if cpu > 0 else None,
        **split,
    }


PARTS = ("allocator", "req_to_token", "tree", "reqs", "sessions", "mamba", "swa", "host")
"""The parts of a :class:`~kvpool.snapshot.PoolSnapshot` a :func:`reuse_row` follows."""


def reuse_row(component: str, runs: int, seed: int = 0) -> dict[str, Any]:
    """What reusing the trusted reference's unchanged snapshot parts could save on a lifecycle
    machine (``--reuse``): ``runs`` runs in this process, as :func:`machine_row`. Columns:
    ``kept_pct`` (steps after which the reference's whole snapshot equals its previous one),
    then per part the percentage of steps that left it equal (``-``: a part this machine never
    has); ``us_snap_a`` (the reference's snapshot, us per step over all steps) and
    ``us_snap_a_kept`` (the share of it spent on the kept steps: what skipping those snapshots
    would save); ``us_inv`` (the invariants, for scale). The comparisons run outside the timed
    parts."""
    import torch

    from kvpool.testing.campaign import quiet_collector, run_machine
    from kvpool.testing.implementations import optimized_implementation, reference_implementation
    from kvpool.testing.lockstep_driver import Lockstep

    torch.set_num_threads(1)
    ref, twin = reference_implementation(), optimized_implementation("torch")
    seen: Counter[str] = Counter()
    present: set[str] = set()
    inner = Lockstep._snapshot

    def observed(self: Lockstep, manager: Any, side: int) -> Any:
        if side:
            return inner(self, manager, side)
        start = time.thread_time_ns()
        snap = inner(self, manager, side)
        spent = time.thread_time_ns() - start
        seen["snap_a"] += spent
        seen["snaps"] += 1
        if snap == self.snap_a:
            seen["kept"] += 1
            seen["snap_a_kept"] += spent
        for part in PARTS:
            now = getattr(snap, part)
            if now is not None:
                present.add(part)
            seen[part] += now == getattr(self.snap_a, part)
        return snap

    Lockstep._snapshot = observed  # type: ignore[method-assign]
    try:
        with quiet_collector(), step_split() as spent:
            result = run_machine(component, ref, twin, 1e9, seed=seed,
                                 steps_per_run=STEPS_PER_RUN, max_runs=runs)  # fmt: skip
    finally:
        Lockstep._snapshot = inner  # type: ignore[method-assign]
    steps, snaps = max(result.steps, 1), max(seen["snaps"], 1)
    return {
        "machine": component,
        "steps": result.steps,
        "kept_pct": round(100 * seen["kept"] / snaps, 1),
        **{part: round(100 * seen[part] / snaps) if part in present else "-" for part in PARTS},
        "us_snap_a": round(seen["snap_a"] * 1e-3 / steps),
        "us_snap_a_kept": round(seen["snap_a_kept"] * 1e-3 / steps),
        "us_inv": round(spent["inv"] * 1e-3 / steps),
    }


def workers_row(
    seconds: float, workers: int = 2, seed: int = 0, impl: str = TWIN
) -> dict[str, Any]:
    """The ``manager`` campaign against ``impl`` (the default campaign's twin unless told) on
    ``workers`` processes for ``seconds`` of wall time: steps per wall second, as
    ``kvpool verify`` reports them."""
    from kvpool.testing.workers import CampaignSpec, run_parallel

    spec = CampaignSpec("manager", "reference", impl, seed, STEPS_PER_RUN, ("reference", impl))
    result = run_parallel(spec, seconds, workers)
    suffix = "" if impl == TWIN else f" vs {impl}"
    return {
        "machine": f"manager --workers {workers}{suffix}",
        "runs": result.configurations,
        "steps": result.steps,
        "checks": result.invariant_checks,
        "failures": result.failures,
        "wall_s": round(result.seconds, 1),
        "steps_per_s": round(result.steps_per_second),
    }


def run(quick: bool, only: str | None = None, runs: int | None = None,
        seconds: float | None = None, impl: str = TWIN) -> list[dict[str, Any]]:  # fmt: skip
    """Rows of every machine whose name contains ``only`` (all by default), then the
    two-worker row (unless ``only`` excludes ``manager``), against the candidate ``impl``."""
    from kvpool.testing.machines import TARGETS

    n = runs if runs is not None else (4 if quick else 20)
    rows = [machine_row(name, n, impl=impl) for name in TARGETS if only is None or only in name]
    if only is None or only in "manager":
        wall = seconds if seconds is not None else (3.0 if quick else 20.0)
        rows.append(workers_row(wall, impl=impl))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 runs a machine, 3 s on workers")
    parser.add_argument("--only", default=None, help="machines whose name contains this")
    parser.add_argument("--runs", type=int, default=None, help="runs per machine (default 20)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="wall seconds of the two-worker campaign (default 20)")  # fmt: skip
    parser.add_argument("--impl", default=TWIN,
                        help="the candidate: an implementation spec, as kvpool verify's "
                        "--impl takes (sglang:0.5.23, sglang:0.5.23+naive...; default: the "
                        "twin)")  # fmt: skip
    parser.add_argument("--reuse", action="store_true",
                        help="the lifecycle machines: their unchanged snapshot parts")  # fmt: skip
    args = parser.parse_args(argv)
    if args.reuse:
        from kvpool.testing.machines import TARGETS

        n = args.runs if args.runs is not None else 20
        names = [m for m in TARGETS if m.endswith("manager") and (args.only or "") in m]
        rows = [reuse_row(name, n) for name in names]
    else:
        rows = run(args.quick, args.only, args.runs, args.seconds, args.impl)
    if not rows:
        print(f"no machine matches {args.only!r}", file=sys.stderr)
        return 1
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

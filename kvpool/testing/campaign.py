"""The time-budgeted lockstep campaign behind ``kvpool verify``, in this process.

A campaign is a sequence of runs of one machine (``component``: the lifecycle ``manager`` or a
component of :data:`kvpool.testing.machines.TARGETS`). Run ``i`` seeds
``random.Random(f"{seed}/{i}")``, draws a configuration and ``steps_per_run`` operations
(:mod:`kvpool.testing.runs`), executing each on both implementations. It stops at the time
budget or at the first failure. :mod:`kvpool.testing.workers` runs the same runs in worker
processes (crash-proof); this module is the in-process form the pytest helpers and the workers
themselves use.

A failure is shrunk without hypothesis: the failing run's operations are plain data, so the
campaign replays sub-lists (dropping chunks, then single steps) and keeps any that still fail with
the same detector. The result is deterministic for a given seed and failing run.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.testing.bundle import Implementation
from kvpool.testing.lockstep_driver import Factory, Lockstep, LockstepFailure
from kvpool.testing.runs import execute, run_config, shrink_ops
from kvpool.testing.swarm import Op, RandomChooser

Progress = Callable[[float, int], None]
"""Called after each run with (seconds elapsed, steps so far)."""


COLLECTOR_THRESHOLDS = (20_000, 20, 50)
"""The cyclic collector's thresholds during a campaign (Python's defaults: 700, 10, 10). A
lockstep step allocates thousands of short-lived tuples (two snapshots), which made a young
collection every few steps; freed trees hold cycles, so the collector still runs, less often."""


@contextlib.contextmanager
def quiet_collector() -> Iterator[None]:
    """A long campaign's collector: the objects built before it (modules, both implementations'
    factories) are frozen out of the collector's sight, so an old-generation collection walks
    only the runs' objects, and young collections run at :data:`COLLECTOR_THRESHOLDS`. On
    leaving, the thresholds are restored and the frozen objects handed back (nothing was
    collected that would have been: they were alive when frozen)."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@dataclass
class CampaignFailure:
    """The shrunk failure: the run's config, the detector, the minimal ops and the report."""

    run: int
    config: dict[str, Any]
    detector: str
    original_steps: int
    ops: list[str]
    report: str


@dataclass
class CampaignResult:
    """Totals of a campaign (``steps_per_second`` counts lockstep steps: one op on both)."""

    seed: int
    seconds: float
    configurations: int = 0
    steps: int = 0
    invariant_checks: int = 0
    failures: int = 0
    page_sizes: dict[str, int] = field(default_factory=dict)
    failure: CampaignFailure | None = None
    component: str = "manager"
    coverage: dict[str, int] = field(default_factory=dict)
    """Coverage tag -> steps that earned it (:mod:`kvpool.testing.machines.coverage`)."""
    workers: int = 0
    """Worker processes used (0: in this process)."""
    error: str | None = None
    """Why the campaign stopped early without a lockstep verdict (an internal error)."""

    def add_run(self, page_size: int, steps: int, checks: int, tags: dict[str, int]) -> None:
        """Fold one run's totals in (its configuration's page size, steps, checks, tags)."""
        self.configurations += 1
        key = f"page_size={page_size}"
        self.page_sizes[key] = self.page_sizes.get(key, 0) + 1
        self.steps += steps
        self.invariant_checks += checks
        for tag, n in tags.items():
            self.coverage[tag] = self.coverage.get(tag, 0) + n

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps_per_second"] = round(self.steps_per_second, 1)
        return out


def _manager_impls(factory_a: Factory, factory_b: Factory, labels: tuple[str, str]) -> tuple[
    Implementation, Implementation
]:  # fmt: skip
    return Implementation(labels[0], manager=factory_a), Implementation(
        labels[1], manager=factory_b
    )


def replay(
    factory_a: Factory,
    factory_b: Factory,
    config: PoolConfig,
    ops: Sequence[Op],
    labels: tuple[str, str] = ("reference", "candidate"),
) -> LockstepFailure | None:
    """Run ``ops`` on a fresh pair of memory managers; the failure they trigger, if any."""
    try:
        pair = Lockstep(factory_a, factory_b, config, labels)
        for op in ops:
            pair.run(op)
    except LockstepFailure as failure:
        return failure
    return None


def shrink(
    factory_a: Factory,
    factory_b: Factory,
    config: PoolConfig,
    ops: Sequence[Op],
    detector: str,
    labels: tuple[str, str] = ("reference", "candidate"),
    budget_s: float = 20.0,
    max_replays: int | None = None,
) -> tuple[list[Op], LockstepFailure | None]:
    """Smallest sub-list of a lifecycle run's ``ops`` that still fails with ``detector``
    (:func:`kvpool.testing.runs.shrink_ops`) and its failure."""
    impl_a, impl_b = _manager_impls(factory_a, factory_b, labels)
    return shrink_run("manager", impl_a, impl_b, config, ops, detector, labels, budget_s,
                      max_replays)  # fmt: skip


def shrink_run(
    component: str,
    impl_a: Implementation,
    impl_b: Implementation,
    config: PoolConfig,
    ops: Sequence[Op],
    detector: str,
    labels: tuple[str, str] = ("reference", "candidate"),
    budget_s: float = 20.0,
    max_replays: int | None = None,
) -> tuple[list[Op], LockstepFailure | None]:
    """Shrink a failing run of any machine in this process; the shrunk ops and their failure."""

    def again(candidate: Sequence[Op]) -> tuple[str, int] | None:
        found = execute(component, impl_a, impl_b, config, ops=candidate, labels=labels).failure
        return None if found is None else (found.detector, found.step)

    best = shrink_ops(again, ops, detector, budget_s, max_replays)
    return best, execute(component, impl_a, impl_b, config, ops=best, labels=labels).failure


def run_campaign(
    factory_a: Factory,
    factory_b: Factory,
    seconds: float,
    seed: int = 0,
    steps_per_run: int = 60,
    labels: tuple[str, str] = ("reference", "candidate"),
    progress: Progress | None = None,
    config_drawer: Callable[[RandomChooser], PoolConfig] | None = None,
    max_runs: int | None = None,
) -> CampaignResult:
    """The lifecycle campaign of two memory-manager factories (see :func:`run_machine`)."""
    impl_a, impl_b = _manager_impls(factory_a, factory_b, labels)
    return run_machine("manager", impl_a, impl_b, seconds, seed, steps_per_run, labels, progress,
                       max_runs, config_drawer)  # fmt: skip


def run_machine(
    component: str,
    impl_a: Implementation,
    impl_b: Implementation,
    seconds: float,
    seed: int = 0,
    steps_per_run: int = 60,
    labels: tuple[str, str] = ("reference", "candidate"),
    progress: Progress | None = None,
    max_runs: int | None = None,
    config_drawer: Callable[[RandomChooser], PoolConfig] | None = None,
) -> CampaignResult:
    """Run lockstep runs of ``component`` until ``seconds`` have passed (or ``max_runs`` runs
    were made) or one fails (then shrink it), all in this process."""
    result = CampaignResult(seed=seed, seconds=0.0, component=component)
    start = time.monotonic()
    run = 0
    while time.monotonic() - start < seconds and (max_runs is None or run < max_runs):
        chooser, config = run_config(component, impl_b, seed, run)
        if config_drawer is not None:
            config = config_drawer(chooser)
        done = execute(component, impl_a, impl_b, config, chooser=chooser, steps=steps_per_run,
                       labels=labels)  # fmt: skip
        result.add_run(config.page_size, done.steps, done.checks, dict(done.coverage))
        if done.failure is not None:
            result.failures = 1
            result.seconds = time.monotonic() - start
            ops, shrunk = shrink_run(component, impl_a, impl_b, config, done.ops,
                                     done.failure.detector, labels)  # fmt: skip
            final = shrunk or done.failure
            result.failure = CampaignFailure(run, asdict(config), final.detector, len(done.ops),
                                             [op.render() for op in ops], str(final))  # fmt: skip
            return result
        run += 1
        if progress is not None:
            progress(time.monotonic() - start, result.steps)
    result.seconds = time.monotonic() - start
    return result

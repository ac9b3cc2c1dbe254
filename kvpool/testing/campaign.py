"""The time-budgeted lockstep campaign behind ``kvpool verify``.

A campaign is a sequence of runs. Run ``i`` seeds ``random.Random((seed, i))``, draws a pool
configuration from the swarm (:func:`kvpool.testing.swarm.draw_config`) and ``steps_per_run``
operations (:data:`kvpool.testing.swarm.KINDS`), executing each on both implementations
through :class:`kvpool.testing.lockstep_driver.Lockstep`. It stops at the time budget or at the
first failure.

A failure is shrunk without hypothesis: the failing run's operations are plain data, so the
campaign replays sub-lists (dropping chunks, then single steps) and keeps any that still fail with
the same detector. The result is deterministic for a given seed and failing run.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvpool.config import PoolConfig

# The factories are re-exported: ``kvpool.testing.campaign.reference_factory`` is documented.
from kvpool.testing.factories import load_factory as load_factory
from kvpool.testing.factories import optimized_factory as optimized_factory
from kvpool.testing.factories import reference_factory as reference_factory
from kvpool.testing.lockstep_driver import Factory, Lockstep, LockstepFailure
from kvpool.testing.swarm import KINDS, Op, RandomChooser, draw_config, draw_op

Progress = Callable[[float, int], None]
"""Called after each run with (seconds elapsed, steps so far)."""


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

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps_per_second"] = round(self.steps_per_second, 1)
        return out


def replay(
    factory_a: Factory,
    factory_b: Factory,
    config: PoolConfig,
    ops: Sequence[Op],
    labels: tuple[str, str] = ("reference", "candidate"),
) -> LockstepFailure | None:
    """Run ``ops`` on a fresh pair; the failure they trigger, if any."""
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
    """Smallest sub-list of ``ops`` found that still fails with ``detector`` (greedy chunk then
    single-step deletion) and its failure. It stops after ``budget_s`` seconds or
    ``max_replays`` candidate replays, whichever comes first: a replay bound, unlike the clock,
    gives the same result on a loaded machine."""
    deadline = time.monotonic() + budget_s
    best = list(ops)
    last = replay(factory_a, factory_b, config, best, labels)
    replays = 0

    def within() -> bool:
        return time.monotonic() < deadline and (max_replays is None or replays < max_replays)

    def still_fails(candidate: list[Op]) -> LockstepFailure | None:
        nonlocal replays
        replays += 1
        found = replay(factory_a, factory_b, config, candidate, labels)
        return found if found is not None and found.detector == detector else None

    chunk = max(len(best) // 2, 1)
    while chunk >= 1 and within():
        i = 0
        while i + chunk <= len(best) and within():
            found = still_fails(best[:i] + best[i + chunk :])
            if found is None:
                i += chunk
                continue
            # Steps after the failing one never ran: drop them too.
            best, last = (best[:i] + best[i + chunk :])[: found.step], found
        chunk //= 2
    return best, last


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
    """Run lockstep runs until ``seconds`` have passed (or ``max_runs`` runs were made) or one
    fails (then shrink it)."""
    result = CampaignResult(seed=seed, seconds=0.0)
    factory_a(PoolConfig())  # warm-up outside the budget: first imports (torch) take seconds
    factory_b(PoolConfig())
    start = time.monotonic()
    run = 0
    while time.monotonic() - start < seconds and (max_runs is None or run < max_runs):
        chooser = RandomChooser(random.Random(f"{seed}/{run}"))
        config = (config_drawer or draw_config)(chooser)
        result.configurations += 1
        key = f"page_size={config.page_size}"
        result.page_sizes[key] = result.page_sizes.get(key, 0) + 1
        pair = Lockstep(factory_a, factory_b, config, labels)
        try:
            for _ in range(steps_per_run):
                pair.run(draw_op(chooser, pair.view(), chooser.choice(KINDS)))
                result.steps += 1
        except LockstepFailure as failure:
            result.steps += 1
            result.failures = 1
            result.invariant_checks += pair.checks
            result.seconds = time.monotonic() - start
            ops, shrunk = shrink(factory_a, factory_b, config, pair.ops, failure.detector, labels)
            final = shrunk or failure
            result.failure = CampaignFailure(
                run,
                asdict(config),
                final.detector,
                len(pair.ops),
                [op.render() for op in ops],
                str(final),
            )
            return result
        result.invariant_checks += pair.checks
        run += 1
        if progress is not None:
            progress(time.monotonic() - start, result.steps)
    result.seconds = time.monotonic() - start
    return result

"""Hunting one seeded bug: :func:`hunt` runs the lockstep machine (reference vs the mutant)
under a hypothesis profile and reports whether, how fast and by what the bug was caught, with
the shrunk trace length; :func:`format_table` prints the quality suite's table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvpool.testing.campaign import shrink
from kvpool.testing.factories import reference_factory
from kvpool.testing.lockstep_driver import Factory, LockstepFailure
from kvpool.testing.lockstep_machine import make_lockstep_machine
from kvpool.testing.profiles import CI_STEPS
from kvpool.testing.quality.mutant import Mutant


@dataclass
class HuntResult:
    """How one mutant fared: caught or not, by which detector, after how many examples and
    steps, the shrunk trace length (steps) and the time taken (seconds)."""

    name: str
    kind: str
    expected: tuple[str, ...]
    caught: bool
    detector: str | None
    examples: int
    steps: int
    shrunk_steps: int | None
    seconds: float
    report: str = ""

    @property
    def as_expected(self) -> bool:
        return self.caught and self.detector in self.expected


SHRINK_REPLAYS = 4 * CI_STEPS
"""Candidate replays the trace shrinker may make per hunt (160). Greedy deletion over a trace of
``CI_STEPS`` (40) steps needs at most about 120 (the quality suite needs at most 53), so the
bound does not bind; it replaces a clock budget, which made shrunk lengths depend on the load.
(Written as a product: hypothesis mixes local integer literals of 100 and up into its draws.)"""


def hunt(
    mutant: Mutant,
    test_settings: settings,
    base: Factory | None = None,
    shrink_replays: int = SHRINK_REPLAYS,
    shrink_s: float = 20.0,
) -> HuntResult:
    """Run reference vs ``mutant`` under ``test_settings``; shrink the failure found (at most
    ``shrink_replays`` replays; ``shrink_s`` seconds only guards against a hang)."""
    factory_b = mutant.factory(base)
    machine = make_lockstep_machine(
        reference_factory,
        factory_b,
        mutant.config_drawer(),
        ("reference", mutant.name),
        kinds=mutant.kinds,
        stops=mutant.stops,
    )
    start = time.monotonic()
    failure: LockstepFailure | None = None
    try:
        run_state_machine_as_test(machine, settings=test_settings)
    except LockstepFailure as found:
        failure = found
    shrunk: int | None = None
    pair = machine.last_pair
    if failure is not None and pair is not None:
        ops, final = shrink(
            reference_factory, factory_b, pair.config, pair.ops, failure.detector,
            ("reference", mutant.name), shrink_s, shrink_replays,
        )  # fmt: skip
        shrunk = len(ops)
        failure = final or failure
    return HuntResult(
        mutant.name, mutant.kind, mutant.expected, failure is not None,
        failure.detector if failure else None, machine.examples, machine.steps, shrunk,
        time.monotonic() - start, str(failure) if failure else "",
    )  # fmt: skip


def format_table(results: list[HuntResult]) -> str:
    """The quality-suite table (one row per mutant) and the kill rate."""
    head = f"{'mutant':<24} {'caught by':<22} {'expected':<4} {'examples':>8} {'steps':>6} "
    head += f"{'shrunk':>6} {'s':>5}"
    lines = [head, "-" * len(head)]
    for r in results:
        shrunk = "-" if r.shrunk_steps is None else str(r.shrunk_steps)
        caught_by = r.detector or "NOT CAUGHT"
        lines.append(
            f"{r.name:<24} {caught_by:<22} {'yes' if r.as_expected else 'no':<4} "
            f"{r.examples:>8} {r.steps:>6} {shrunk:>6} {r.seconds:>5.1f}"
        )
    killed = sum(r.caught for r in results)
    rate = 100.0 * killed / max(len(results), 1)
    lines.append(f"kill rate: {killed}/{len(results)} ({rate:.0f}%)")
    return "\n".join(lines)

"""Seeded bugs in one component, hunted by that component's machine.

A :class:`ComponentMutant` patches one freshly built component of the optimized twin (instance
attributes only, as :class:`~kvpool.testing.quality.Mutant` does for a whole manager) and
names the detectors expected to catch it. :func:`hunt_component` runs the component machine
(reference against the mutated twin, checked mode OFF and misuse rules off, as in production, so
that the invariants and the lockstep comparison, not the twin's own checks, find the damage)
over a fixed number of seeded runs, and shrinks the first failure with a bounded number of
replays, so that its result does not depend on the machine's load.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpool.rules import Rules
from kvpool.testing.bundle import Implementation
from kvpool.testing.campaign import shrink_run
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines import TARGETS
from kvpool.testing.quality.hunt import SHRINK_REPLAYS, HuntResult
from kvpool.testing.runs import execute
from kvpool.testing.swarm import RandomChooser

ComponentPatch = Callable[[Any], None]

HUNT_RUNS = 40
"""Seeded runs per hunt (the ``ci`` profile's examples)."""
HUNT_STEPS = 40
"""Steps per run (the ``ci`` profile's steps)."""


@dataclass(frozen=True)
class ComponentMutant:
    """A seeded bug in ``component``: ``patch(obj)`` injects it into one built component;
    ``expected`` detectors should catch it. ``page_sizes`` focuses the runs; ``rules`` are
    the rules its runs draw under (None: kvpool's own), misuse rules off either way."""

    name: str
    kind: str
    expected: tuple[str, ...]
    patch: ComponentPatch
    component: str = "swa_allocator"
    page_sizes: tuple[int, ...] = (1, 2, 4)
    rules: Rules | None = None

    def implementation(self, base: Implementation | None = None) -> Implementation:
        """``base`` (default: the unchecked torch twin) with this bug in every ``component`` it
        builds, misuse rules off."""
        base = base or optimized_implementation("torch", checked=False)
        build = getattr(base, self.component)
        assert build is not None, f"{base.label} provides no {self.component}"

        def mutated(*args: Any) -> Any:
            obj = build(*args)
            self.patch(obj)
            return obj

        rules = dataclasses.replace(self.rules or Rules(), rejects_misuse=False)
        patched: dict[str, Any] = {self.component: mutated}
        return dataclasses.replace(base, label=self.name, rules=rules, **patched)


def hunt_component(
    mutant: ComponentMutant,
    runs: int = HUNT_RUNS,
    steps: int = HUNT_STEPS,
    seed: int = 0,
    base: Implementation | None = None,
) -> HuntResult:
    """Run reference vs ``mutant`` (built on ``base``, default the unchecked torch twin) for
    ``runs`` seeded runs of ``steps`` steps (page sizes from ``mutant.page_sizes``); stop at the
    first failure and shrink it."""
    impl_a, impl_b = reference_implementation(), mutant.implementation(base)
    target = TARGETS[mutant.component]
    labels = ("reference", mutant.name)
    start = time.monotonic()
    total = 0
    for run in range(runs):
        chooser = RandomChooser(random.Random(f"{seed}/{mutant.name}/{run}"))
        config = target.draw_config(chooser, impl_b)
        ps = mutant.page_sizes[run % len(mutant.page_sizes)]
        config = dataclasses.replace(config, page_size=ps, size=config.num_pages * ps)
        done = execute(mutant.component, impl_a, impl_b, config, chooser=chooser, steps=steps,
                       labels=labels)  # fmt: skip
        total += done.steps
        if done.failure is None:
            continue
        ops, final = shrink_run(mutant.component, impl_a, impl_b, config, done.ops,
                                done.failure.detector, labels, 20.0, SHRINK_REPLAYS)  # fmt: skip
        failure = final or done.failure
        return HuntResult(mutant.name, mutant.kind, mutant.expected, True, failure.detector,
                          run + 1, total, len(ops), time.monotonic() - start,
                          str(failure))  # fmt: skip
    return HuntResult(mutant.name, mutant.kind, mutant.expected, False, None, runs, total, None,
                      time.monotonic() - start)  # fmt: skip


__all__ = ["HUNT_RUNS", "HUNT_STEPS", "ComponentMutant", "hunt_component"]

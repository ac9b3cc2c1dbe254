"""Seeded bugs that rewrite a whole implementation, hunted by one component machine.

An :class:`ImplementationMutant` turns an :class:`~kvpool.testing.bundle.Implementation` (by
default the unchecked torch twin's) into a buggy one: a patched step of a step module (such as
the Mamba lifecycle steps), or a patched method on each component built. It names the detectors
that must catch it. :func:`hunt_implementation` runs the component machine, reference against
the mutant, for a fixed number of seeded runs (deterministic), and reports as
:func:`kvpool.testing.quality.hunt` does. Both sides follow ``rejects_misuse=False``: with
checked mode off the twin does not police misuse, so only the invariants and the lockstep
comparison can find the damage. A mutant with a ``release`` runs both sides as kvpool's twins
stand in for that SGLang release instead (its rules preset, its server's tree:
:func:`~kvpool.testing.implementations.following_release`; the presets police no misuse either):
bugs on the paths only that release's rules take.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvpool.rules import Rules
from kvpool.testing.bundle import Implementation
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import (
    following_release,
    optimized_implementation,
    reference_implementation,
)
from kvpool.testing.quality.hunt import HuntResult

ImplPatch = Callable[[Implementation], Implementation]


@dataclass(frozen=True)
class ImplementationMutant:
    """A seeded bug of one component machine: ``patch(impl)`` returns the buggy implementation;
    one of ``expected`` (invariant ids, ``lockstep-diff``, ``crash``...) must catch it."""

    name: str
    kind: str
    expected: tuple[str, ...]
    patch: ImplPatch
    component: str = "hybrid_req_to_token_pool"
    release: str | None = None
    """An SGLang release both sides follow (its rules preset and its server's tree); None:
    kvpool's own rules with misuse off."""
    runs: int = 40
    """The seeded runs :func:`hunt_implementation` gives it unless told otherwise (a bug whose
    interleaving is rare gets a larger, still fixed, budget)."""

    def implementation(self, base: Implementation | None = None) -> Implementation:
        """``base`` (default: the unchecked torch twin) with this bug, misuse rules off (or
        following :attr:`release`)."""
        start = self.following(base or optimized_implementation("torch", checked=False))
        return self.patch(dataclasses.replace(start, label=self.name))

    def following(self, impl: Implementation) -> Implementation:
        """``impl`` under this mutant's rules: :attr:`release`'s, else misuse off."""
        if self.release is not None:
            return following_release(impl, self.release)
        return dataclasses.replace(impl, rules=Rules(rejects_misuse=False))


def hunt_implementation(
    mutant: ImplementationMutant,
    runs: int | None = None,
    steps: int = 40,
    seed: int = 0,
    base: Implementation | None = None,
) -> HuntResult:
    """Run ``runs`` (default: the mutant's :attr:`~ImplementationMutant.runs`) seeded runs of
    ``steps`` steps of the mutant's machine, reference against the mutant (built on ``base``,
    default the unchecked torch twin); the first failure is shrunk (by the campaign) and
    reported."""
    start = time.monotonic()
    ref = mutant.following(reference_implementation())
    labels = ("reference", mutant.name)
    result = run_machine(mutant.component, ref, mutant.implementation(base), seconds=600.0,
                         seed=seed, steps_per_run=steps, labels=labels,
                         max_runs=mutant.runs if runs is None else runs)  # fmt: skip
    failure = result.failure
    return HuntResult(
        mutant.name, mutant.kind, mutant.expected, failure is not None,
        failure.detector if failure else None, result.configurations, result.steps,
        len(failure.ops) if failure else None, time.monotonic() - start,
        failure.report if failure else "",
    )  # fmt: skip


__all__ = ["ImplPatch", "ImplementationMutant", "hunt_implementation"]

"""The component lockstep driver: one component of two implementations, stepped together.

A :class:`Target` describes one component machine (allocator, ReqToTokenPool, radix cache): how
to build a side from an :class:`~kvpool.testing.bundle.Implementation`, how to call an
:class:`~kvpool.testing.swarm.Op` on it (converting plain int lists into the side's index type),
how to snapshot it, which invariants to check, how to draw the next operation from a model of
what is held, and which coverage tags a step earns. :class:`ComponentPair` runs one op on both
sides and stops at the first of (the lifecycle driver's order):

1. ``crash``: a side raised something that is not a :class:`~kvpool.errors.KVPoolError`;
2. an invariant id, on B's then A's snapshot;
3. ``lockstep-diff``: different error classes or results;
4. ``invalid-accepted``: a deliberately invalid call was accepted by both;
5. ``unchanged-on-error``: a refused call (an error, or a None allocation where the rules say
   a refusal changes nothing) changed the state;
6. ``lockstep-diff``: the snapshots differ.

Ops are plain data, so a failing run is replayed and shrunk like a lifecycle run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvpool.config import PoolConfig
from kvpool.errors import InvariantViolation, KVPoolError
from kvpool.testing import report
from kvpool.testing.bundle import Implementation
from kvpool.testing.lockstep_driver import LockstepFailure, without_frames
from kvpool.testing.swarm import Chooser, Op


@dataclass
class Outcome:
    """What one side did: its normalized result or its error, and its snapshots around it."""

    result: Any
    error: BaseException | None
    before: Any
    after: Any


class Target(Protocol):
    """One component machine (see the module docstring)."""

    name: str

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        """A configuration for this component, following ``impl``'s rules."""
        ...

    def build(self, impl: Implementation, config: PoolConfig) -> Any:
        """A side: whatever :meth:`call` and :meth:`snapshot` need."""
        ...

    def new_model(self, config: PoolConfig) -> Any:
        """The generator's model of the state (updated from side A's outcomes)."""
        ...

    def draw_op(self, c: Chooser, model: Any, rejects_misuse: bool) -> Op:
        """The next operation; invalid ones only when ``rejects_misuse``."""
        ...

    def call(self, side: Any, op: Op) -> Any:
        """Execute ``op`` on ``side``; returns the raw result."""
        ...

    def snapshot(self, side: Any) -> Any:
        """A plain, comparable snapshot of the side."""
        ...

    def observe(self, model: Any, op: Op, outcome: Outcome) -> None:
        """Update the model from side A's outcome."""
        ...

    def check(self, model: Any, snap: Any, previous: Any) -> int:
        """Invariants on one side's snapshot; returns the number of checks."""
        ...

    def refusal_must_not_change(self, config: PoolConfig, op: Op, outcome: Outcome) -> bool:
        """Whether ``outcome`` is a refusal (an error, or a None allocation) that must leave the
        state unchanged under ``config.rules``."""
        ...

    def materialize(self, model: Any, op: Op) -> Op | None:
        """The concrete call for symbolic ``op`` in the model's state (None: not applicable
        now, the step is skipped), so that every sub-list of a run stays valid."""
        ...

    def coverage(self, model: Any, op: Op, outcome: Outcome) -> list[str]:
        """Coverage tags this step earned (from side A, the model as it was before)."""
        ...

    def pretty(self, snap: Any) -> str:
        """The snapshot for a failure report."""
        ...


class ComponentPair:
    """Two sides of one :class:`Target` built from one config, stepped together."""

    def __init__(
        self,
        target: Target,
        impl_a: Implementation,
        impl_b: Implementation,
        config: PoolConfig,
        labels: tuple[str, str] = ("reference", "candidate"),
    ) -> None:
        self.target, self.config, self.labels = target, config, labels
        self.rejects_misuse = config.rules.rejects_misuse
        self.lines: list[str] = []
        self.ops: list[Op] = []
        self.checks = 0
        self.coverage: Counter[str] = Counter()
        self.model = target.new_model(config)
        self.sides: list[Any] = []
        self.snaps: list[Any] = []
        for label, impl in zip(labels, (impl_a, impl_b), strict=True):
            try:
                side = target.build(impl, config)
                snap = target.snapshot(side)
            except Exception as exc:  # a typed refusal or not: the side cannot be run at all
                raise self.fail("crash", f"{label} could not be built: {exc!r}") from exc
            self.sides.append(side)
            self.snaps.append(snap)
        self.same = self.snaps[0] == self.snaps[1]
        """Whether the latest snapshots of A and B are equal."""
        self._check([None, None], both=True)

    def draw(self, c: Chooser) -> Op:
        """The next operation from the model."""
        return self.target.draw_op(c, self.model, self.rejects_misuse)

    def fail(self, detector: str, detail: str, indices: tuple[int, ...] = ()) -> LockstepFailure:
        out = [f"=== kvpool component lockstep failure ({self.target.name}): {detector} ==="]
        out.append(f"config: {self.config}")
        out.append(f"minimal trace ({len(self.lines)} steps):")
        out.extend("  " + s for s in self.lines)
        where = f"after step {len(self.lines)}" if self.lines else "before the first step"
        out.append(f"failed {where}: {detail}")
        for label, snap in zip(self.labels, self.snaps, strict=False):
            out.append(f"--- {label} ---")
            out.append(self.target.pretty(snap))
        return LockstepFailure(detector, len(self.lines), "\n".join(out), indices)

    def _check(self, previous: Sequence[Any], both: bool) -> None:
        """Invariants on B's snapshot, then on A's when ``both``: a check is a pure function of
        (model, snapshot, previous snapshot), so when A's two equal B's the verdict is B's."""
        for i in (1, 0) if both else (1,):
            try:
                self.checks += self.target.check(self.model, self.snaps[i], previous[i])
            except InvariantViolation as exc:
                raise self.fail(exc.invariant_id, f"{self.labels[i]}: {exc}", exc.indices) from exc

    def _one(self, i: int, op: Op) -> Outcome:
        before = self.snaps[i]
        error: BaseException | None
        try:
            result, error = report.normalize(self.target.call(self.sides[i], op)), None
        except KVPoolError as exc:
            result, error = None, without_frames(exc)
        except Exception as exc:  # a crash: its traceback goes into the report
            result, error = None, exc
        try:
            after = self.target.snapshot(self.sides[i])
        except Exception as exc:
            raise self.fail("crash", f"{self.labels[i]} snapshot raised {exc!r}") from exc
        return Outcome(result, error, before, after)

    def run(self, op: Op) -> Outcome:
        """Execute ``op`` on both sides, compare, check; returns side A's outcome."""
        self.ops.append(op)
        concrete = self.target.materialize(self.model, op)
        if concrete is None:
            self.lines.append(report.format_step(len(self.lines) + 1, op.render(), "skipped"))
            return Outcome(None, None, self.snaps[0], self.snaps[0])
        op = concrete
        a, b = self._one(0, op), self._one(1, op)
        shown = f"raises {type(a.error).__name__}" if a.error else report.short(a.result)
        self.lines.append(report.format_step(len(self.lines) + 1, op.render(), shown))
        for label, out in zip(self.labels, (a, b), strict=True):
            if out.error is not None and not isinstance(out.error, KVPoolError):
                raise self.fail(
                    "crash", f"{label} raised {type(out.error).__name__}: {out.error}"
                ) from out.error
        previous, same_before = self.snaps, self.same
        self.snaps = [a.after, b.after]
        self.same = a.after == b.after
        tags = self.target.coverage(self.model, op, a)
        self.target.observe(self.model, op, a)
        self._check(previous, both=not (self.same and same_before))
        if type(a.error) is not type(b.error):
            raise self.fail(
                "lockstep-diff",
                f"{self.labels[0]} -> {type(a.error).__name__}: {a.error}; "
                f"{self.labels[1]} -> {type(b.error).__name__}: {b.error}",
            )
        if a.result != b.result:
            raise self.fail(
                "lockstep-diff",
                f"results differ: {self.labels[0]} -> {report.short(a.result, 64)}; "
                f"{self.labels[1]} -> {report.short(b.result, 64)}",
            )
        if op.expect_error and a.error is None:
            raise self.fail("invalid-accepted", "an invalid call was accepted by both")
        for label, out in zip(self.labels, (b, a), strict=True):
            must_not_change = self.target.refusal_must_not_change(self.config, op, out)
            if must_not_change and out.before != out.after:
                found = report.first_difference(out.before, out.after)
                where = f" at {found[0]}: {found[1]!r} -> {found[2]!r}" if found else ""
                raise self.fail(
                    "unchanged-on-error", f"{label} changed state while refusing{where}"
                )
        if not self.same:
            found = report.first_difference(a.after, b.after)
            where = "?"
            if found is not None:
                where = f"{found[0]}: {self.labels[0]}={found[1]!r} {self.labels[1]}={found[2]!r}"
            raise self.fail("lockstep-diff", f"snapshots differ at {where}")
        self.coverage.update(tags)
        return a


__all__ = ["ComponentPair", "Outcome", "Target"]

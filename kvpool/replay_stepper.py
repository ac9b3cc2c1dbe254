"""What the trace replay steps (:mod:`kvpool.replay`): both implementations in lockstep
(:class:`~kvpool.testing.lockstep_driver.Lockstep`) or one alone (:class:`SoloStepper`), whose every
invariant is still checked on its snapshots.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvpool.config import PoolConfig
from kvpool.errors import InvariantViolation, KVPoolError
from kvpool.invariants import check_all
from kvpool.snapshot import PoolSnapshot
from kvpool.testing.lockstep_driver import Factory, LockstepFailure, without_frames
from kvpool.testing.swarm import Op


class Stepper(Protocol):
    """What the driver steps: :class:`~kvpool.testing.lockstep_driver.Lockstep` or
    :class:`SoloStepper` (``a`` is the implementation whose statistics are reported)."""

    config: PoolConfig
    a: Any
    checks: int

    def run(self, op: Op) -> Any: ...


class SoloStepper:
    """One implementation alone: each op is called, and every ``check_every`` steps its snapshot
    goes through every invariant (:func:`kvpool.invariants.check_all`, the transition ones
    against a snapshot taken just before that step: states several steps apart would make them
    report locks released and evicted in between). Returns the result or the
    :class:`~kvpool.errors.KVPoolError` instance, like :meth:`Lockstep.run`; a violation raises
    :class:`~kvpool.testing.lockstep_driver.LockstepFailure` named by the invariant id; any other
    exception propagates."""

    def __init__(self, factory: Factory, config: PoolConfig, label: str, check_every: int = 1):
        self.config, self.label = config, label
        self.check_every = max(check_every, 1)
        self.a = factory(config)
        self.steps = 0
        self.checks = 0
        self.snap: PoolSnapshot = self.a.snapshot()
        self._check(None, "build")

    def _check(self, prev: PoolSnapshot | None, what: str) -> None:
        try:
            self.checks += check_all(self.snap, prev)
        except InvariantViolation as exc:
            text = f"{self.label} after step {self.steps} ({what}): {exc}"
            raise LockstepFailure(exc.invariant_id, self.steps, text, exc.indices) from exc

    def run(self, op: Op) -> Any:
        self.steps += 1
        due = self.steps % self.check_every == 0
        if due and self.check_every > 1:  # transition invariants compare consecutive states
            self.snap = self.a.snapshot()
        try:
            out: Any = op.call(self.a)
        except KVPoolError as exc:
            out = without_frames(exc)  # (its frames would hold this one: a cycle per refusal)
        if due:
            prev, self.snap = self.snap, self.a.snapshot()
            self._check(prev, op.name)
        return out

    def check_now(self) -> None:
        """Check the current state if the last step was not checked (the end of a replay; the
        state invariants only: the previous snapshot is several steps old)."""
        if self.steps % self.check_every:
            self.snap = self.a.snapshot()
            self._check(None, "end")


__all__ = ["SoloStepper", "Stepper"]

"""An implementation's own checks (``run_own_checks()``, e.g. SGLang's scheduler checker over
its components: :mod:`kvpool.sglang.scheduler_checker`) run after kvpool's invariants at every
step, a step that changed nothing included; their InvariantViolation is reported under its id
with the side's label, anything else they raise as a crash, and kvpool's own invariant wins
when both fire."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import InvariantViolation
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.testing.campaign import run_machine
from kvpool.testing.factories import reference_factory
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.lockstep_driver import Lockstep, LockstepFailure
from kvpool.testing.swarm import Op


class Counting(MemoryManager):
    """The twin, counting its own checks and failing them once a request holds ``limit``
    committed tokens (a stand-in for an engine's leak checker)."""

    def __init__(self, config: PoolConfig, limit: int = 10**9, broken: bool = False) -> None:
        super().__init__(config, checked=True)
        self.own_runs = 0
        self.limit = limit
        self.broken = broken

    def run_own_checks(self) -> None:
        self.own_runs += 1
        if self.broken:
            raise RuntimeError("the checker itself broke")
        held = max((r.kv_committed_len for r in self.reqs.values()), default=0)
        if held >= self.limit:
            raise InvariantViolation("OWN-LIMIT", f"a request holds {held} committed tokens")


def _pair(limit: int = 10**9, broken: bool = False) -> Lockstep:
    return Lockstep(reference_factory, lambda c: Counting(c, limit, broken), PoolConfig(size=16))


def test_own_checks_run_at_construction_and_every_step_refused_ones_included() -> None:
    pair = _pair()
    assert [label for label, _ in pair.own_checks] == ["candidate"]  # the reference has none
    plain = Lockstep(reference_factory, lambda c: MemoryManager(c, checked=True),
                     PoolConfig(size=16))  # fmt: skip
    b = pair.b
    assert isinstance(b, Counting) and b.own_runs == 1
    for op in (
        Op("new_req", ("r1", [1, 2, 3, 4])),
        Op("extend", (["r1"],)),
        Op("finish", (["nope"],), expect_error=True),  # refused: the state is kept
    ):
        pair.run(op)
        plain.run(op)
    assert b.own_runs == 4
    assert pair.checks - plain.checks == b.own_runs  # each run counted as one check


def test_a_failed_own_check_is_reported_by_its_id_with_the_side() -> None:
    pair = _pair(limit=4)
    pair.run(Op("new_req", ("r1", [1, 2, 3, 4])))
    with pytest.raises(LockstepFailure) as caught:
        pair.run(Op("extend", (["r1"],)))
    assert caught.value.detector == "OWN-LIMIT"
    assert caught.value.step == 2
    assert "candidate: [OWN-LIMIT] a request holds 4 committed tokens" in str(caught.value)


def test_an_own_check_that_breaks_is_a_crash() -> None:
    with pytest.raises(LockstepFailure) as caught:
        _pair(broken=True)
    assert caught.value.detector == "crash"
    assert "candidate.run_own_checks() raised RuntimeError('the checker itself broke')" in str(
        caught.value
    )


class Leaky(Counting):
    """Takes a slot it never gives back at abort (kvpool's invariants see the leak) and fails
    its own check at the same step."""

    def abort(self, rid: str) -> None:
        super().abort(rid)
        self.token_to_kv_pool_allocator.alloc(1)
        self.limit = 0


def test_kvpools_invariant_wins_over_an_own_check() -> None:
    pair = Lockstep(reference_factory, Leaky, PoolConfig(size=16))
    pair.run(Op("new_req", ("r1", [1, 2, 3, 4])))
    pair.run(Op("extend", (["r1"],)))
    with pytest.raises(LockstepFailure) as caught:
        pair.run(Op("abort", ("r1",)))
    assert caught.value.detector == "INV-POOL-ACCOUNTING", str(caught.value)


def test_a_campaign_finds_and_shrinks_an_own_check_failure() -> None:
    candidate = dataclasses.replace(
        optimized_implementation(), label="own-checks", manager=lambda c: Counting(c, limit=6)
    )
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=3,
                         max_runs=40)  # fmt: skip
    assert result.failure is not None
    assert result.failure.detector == "OWN-LIMIT", result.failure.report
    assert result.failure.report.count("  step ") <= 4, result.failure.report

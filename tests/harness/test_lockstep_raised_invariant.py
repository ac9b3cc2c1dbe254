"""A call that raises :class:`~kvpool.errors.InvariantViolation` (an adapter's own check of the
code it wraps failed, e.g. :func:`kvpool.sglang.glue.check_committed`) is reported under that
invariant's id, before the snapshots' invariants, not as a bare difference of outcomes."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import InvariantViolation
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.testing.factories import reference_factory
from kvpool.testing.lockstep_driver import Lockstep, LockstepFailure
from kvpool.testing.swarm import Op


class SelfChecking(MemoryManager):
    """The twin, whose extend raises its own check's violation after doing its work."""

    def extend(self, *args: Any, **kwargs: Any) -> Any:
        super().extend(*args, **kwargs)
        raise InvariantViolation("INV-LENGTHS", "the wrapped code wrote 3, the step commits 4")


def test_a_raised_invariant_is_reported_by_its_id() -> None:
    pair = Lockstep(reference_factory, lambda c: SelfChecking(c, checked=True), PoolConfig(size=16))
    pair.run(Op("new_req", ("r1", [1, 2, 3, 4])))
    with pytest.raises(LockstepFailure) as caught:
        pair.run(Op("extend", (["r1"],)))
    assert caught.value.detector == "INV-LENGTHS"
    assert caught.value.step == 2
    assert "candidate: [INV-LENGTHS] the wrapped code wrote 3, the step commits 4" in str(
        caught.value
    )

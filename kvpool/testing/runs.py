"""One lockstep run, its replay and its shrinking: the unit every campaign executes.

A run is fully determined by (target, seed, run number, the candidate's rules): run ``i``
seeds ``random.Random(f"{seed}/{i}")``, draws its configuration from the target's swarm and
then ``steps`` operations from the pair's model. Because operations are plain data and are
materialized against the model, a run is replayed by executing its op list again, and shrunk by
replaying sub-lists (chunks, then single steps) that still fail with the same detector.
"""

from __future__ import annotations

import random
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvpool.config import PoolConfig
from kvpool.testing.bundle import Implementation
from kvpool.testing.lockstep_driver import LockstepFailure
from kvpool.testing.machines import TARGETS, Pair, make_pair
from kvpool.testing.swarm import Op, RandomChooser

Labels = tuple[str, str]


@dataclass
class RunResult:
    """What one run did: steps executed, invariant checks, coverage tags, the ops it drew and
    the failure that stopped it (None: it ran all its steps)."""

    steps: int = 0
    checks: int = 0
    coverage: Counter[str] = field(default_factory=Counter)
    ops: list[Op] = field(default_factory=list)
    failure: LockstepFailure | None = None


def run_config(target: str, impl_b: Implementation, seed: int, run: int) -> tuple[
    RandomChooser, PoolConfig
]:  # fmt: skip
    """The chooser and configuration of run ``run`` of a campaign seeded ``seed``."""
    chooser = RandomChooser(random.Random(f"{seed}/{run}"))
    return chooser, TARGETS[target].draw_config(chooser, impl_b)


def execute(
    target: str,
    impl_a: Implementation,
    impl_b: Implementation,
    config: PoolConfig,
    *,
    chooser: RandomChooser | None = None,
    steps: int = 0,
    ops: Sequence[Op] | None = None,
    labels: Labels = ("reference", "candidate"),
    on_op: Callable[[Op], None] | None = None,
) -> RunResult:
    """Run ``ops`` (a replay) or ``steps`` operations drawn with ``chooser`` on a fresh pair.
    ``on_op`` sees each op before it executes (a worker streams them, so that a crash of the
    process still leaves the trace so far)."""
    result = RunResult()
    pair: Pair | None = None
    try:
        try:
            pair = make_pair(TARGETS[target], impl_a, impl_b, config, labels)
        except LockstepFailure:
            raise
        except Exception as exc:  # a side that cannot be built: a failure, not a dead worker
            raise build_failure(target, exc) from exc
        todo = list(ops) if ops is not None else None
        count = len(todo) if todo is not None else steps
        for i in range(count):
            if todo is not None:
                op = todo[i]
            else:
                assert chooser is not None
                op = pair.draw(chooser)
            if on_op is not None:
                on_op(op)
            result.steps += 1
            pair.run(op)
    except LockstepFailure as failure:
        result.failure = failure
    if pair is not None:
        result.checks, result.ops = pair.checks, list(pair.ops)
        result.coverage.update(pair.coverage)
    return result


def focused_runs(
    target: str,
    impl_a: Implementation,
    impl_b: Implementation,
    seed: int,
    runs: int,
    keep: Callable[[PoolConfig], bool],
    steps: int = 60,
) -> tuple[int, LockstepFailure | None]:
    """The runs among the first ``runs`` of a campaign seeded ``seed`` whose configuration
    ``keep`` accepts, each as the campaign runs it (the same chooser, ``steps`` operations):
    how many ran, and the first failure (None: all passed; the runs stop there)."""
    ran = 0
    for run in range(runs):
        chooser, config = run_config(target, impl_b, seed, run)
        if not keep(config):
            continue
        ran += 1
        result = execute(target, impl_a, impl_b, config, chooser=chooser, steps=steps)
        if result.failure is not None:
            return ran, result.failure
    return ran, None


def build_failure(target: str, exc: BaseException) -> LockstepFailure:
    """The failure of a run whose implementations could not be built (detector ``build``,
    step 0): one line naming the exception and where it was raised (the deepest frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    text = (f"=== kvpool lockstep failure: build ({target}) ===\n"
            f"building the two sides raised {type(exc).__name__}: {exc}{where} "
            f"(before step 1)")  # fmt: skip
    return LockstepFailure("build", 0, text)


Replayer = Callable[[Sequence[Op]], "tuple[str, int] | None"]
"""Replays ops; returns ``(detector, failing step)`` or None when they pass."""


def shrink_ops(
    replay: Replayer,
    ops: Sequence[Op],
    detector: str,
    budget_s: float = 20.0,
    max_replays: int | None = None,
) -> list[Op]:
    """Smallest sub-list of ``ops`` found that still fails with ``detector``: greedy deletion
    of chunks (halves, quarters, ... single steps). Bounded by ``budget_s`` seconds and
    ``max_replays`` replays (a replay bound gives the same result on a loaded machine)."""
    deadline = time.monotonic() + budget_s
    best = list(ops)
    replays = 0
    chunk = max(len(best) // 2, 1)
    while chunk >= 1:
        i = 0
        while i + chunk <= len(best):
            if time.monotonic() > deadline or (max_replays is not None and replays >= max_replays):
                return best
            candidate = best[:i] + best[i + chunk :]
            replays += 1
            found = replay(candidate)
            if found is None or found[0] != detector:
                i += chunk
                continue
            best = candidate[: found[1]]  # steps after the failing one never ran
        chunk //= 2
    return best


__all__ = [
    "Labels",
    "RunResult",
    "build_failure",
    "execute",
    "focused_runs",
    "run_config",
    "shrink_ops",
]

"""Program-order checks for the checked interpreter: shuffled replays and a race detector.

A GPU runs a launch's programs in no fixed order and concurrently, so a correct kernel's result
may not depend on their order. :func:`first_order_dependence` replays a launch in permuted
orders and compares the memory; :class:`RaceDetector` watches one grid-order run for
non-atomic cross-program conflicts that every sequential order would happen to hide. Both return
descriptions instead of raising; :mod:`kvpool.testing.kernel_harness.interpreter` raises
:class:`kvpool.testing.kernel_harness.interpreter.OrderDependence` with them.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from kvpool.testing.kernel_harness.guarded_memory import GuardedArgs, Region, describe

Program = tuple[int, int, int]
"""A program id ``(pid0, pid1, pid2)``."""

_MANY: Program = (-1, -1, -1)
"""Reader marker: loaded by more than one program."""


def grid_programs(grid: Sequence[int]) -> list[Program]:
    """Every program of a 3-D ``grid``, in grid (row-major) order."""
    return list(itertools.product(range(grid[0]), range(grid[1]), range(grid[2])))


def first_order_dependence(
    run: Callable[[Sequence[Program]], None],
    memory: GuardedArgs,
    start: list[torch.Tensor],
    programs: Sequence[Program],
    seeds: Sequence[int],
) -> str | None:
    """Replay ``programs`` through ``run`` once per seed, each time in that seed's shuffled
    order from the memory snapshot ``start``, and compare with the grid-order result that
    ``memory`` holds on entry.

    Returns a description of the first difference, or None and leaves ``memory`` holding the
    grid-order result again."""
    if not seeds:
        return None
    in_order = memory.snapshot()
    for seed in seeds:
        order = list(programs)
        random.Random(seed).shuffle(order)
        memory.restore(start)
        run(order)
        diff = memory.first_difference(in_order)
        if diff is not None:
            return (
                f"running its {len(programs)} programs in the order of shuffle seed {seed} "
                f"(starting {order[:4]}) changes the result: {diff}"
            )
    memory.restore(in_order)
    return None


class RaceDetector:
    """Per-address record of one run's non-atomic loads and stores, by program.

    Two programs storing different values to one address, or one program loading what another
    stored (or storing what another loaded), is a race on a GPU even when the sequential run
    agrees with every shuffle (a read-modify-write of a counter, say)."""

    def __init__(self, regions: Sequence[Region]) -> None:
        self._regions = regions  # for messages only
        self._writers: dict[int, tuple[Program, Any]] = {}  # address -> (program, value)
        self._readers: dict[int, Program] = {}  # address -> program, or _MANY

    def load(self, program: Program, addrs: np.ndarray) -> str | None:
        """Record ``program`` loading ``addrs``; describe the first conflict, if any."""
        for a in addrs.tolist():
            prev = self._writers.get(a)
            if prev is not None and prev[0] != program:
                return (
                    f"program {program} loads {describe(a, self._regions)} which program "
                    f"{prev[0]} stored (non-atomic read/write race)"
                )
            first = self._readers.get(a)
            if first is None:
                self._readers[a] = program
            elif first != program:
                self._readers[a] = _MANY
        return None

    def store(self, program: Program, addrs: np.ndarray, values: np.ndarray) -> str | None:
        """Record ``program`` storing ``values`` (one per address) to ``addrs``; describe the
        first conflict, if any."""
        for a, v in zip(addrs.tolist(), values.reshape(-1).tolist(), strict=True):
            reader = self._readers.get(a)
            if reader is not None and reader != program:
                who = "other programs" if reader == _MANY else f"program {reader}"
                return (
                    f"program {program} stores {describe(a, self._regions)} which {who} "
                    f"loaded (non-atomic read/write race)"
                )
            prev = self._writers.get(a)
            if prev is not None and prev[0] != program and prev[1] != v:
                return (
                    f"programs {prev[0]} and {program} store different values ({prev[1]} and "
                    f"{v}) to {describe(a, self._regions)}"
                )
            self._writers[a] = (program, v)
        return None

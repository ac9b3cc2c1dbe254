"""The quality suite's machinery: seeded bugs are hunted by the harness, which must catch each.

The bugs themselves live with the tests (``tests/quality``: the project's seeded bugs in its
twin); this package holds what hunts them, so that the same suite can be pointed at another
implementation with bugs of its own:

- :class:`Mutant` patches one built memory manager (``base``: any factory, default the unchecked
  torch twin); :func:`hunt` runs the lockstep machine, reference against it, under a hypothesis
  profile, and shrinks what it finds;
- :class:`ComponentMutant` patches one built component (``base``: any
  :class:`~kvpool.testing.bundle.Implementation`); :func:`hunt_component` runs that component's
  machine for a fixed number of seeded runs;
- :class:`ImplementationMutant` rewrites a whole implementation; :func:`hunt_implementation`;
- :func:`need`, :func:`wrap`, :func:`during`: helpers for writing patches;
- :class:`HuntResult` and :func:`format_table`: one row per bug and the kill rate.
"""

from __future__ import annotations

from kvpool.testing.quality.component import (
    HUNT_RUNS,
    HUNT_STEPS,
    ComponentMutant,
    ComponentPatch,
    hunt_component,
)
from kvpool.testing.quality.hunt import SHRINK_REPLAYS, HuntResult, format_table, hunt
from kvpool.testing.quality.implementation import (
    ImplementationMutant,
    ImplPatch,
    hunt_implementation,
)
from kvpool.testing.quality.mutant import Mutant, Patch, during, need, wrap

__all__ = [
    "HUNT_RUNS",
    "HUNT_STEPS",
    "SHRINK_REPLAYS",
    "ComponentMutant",
    "ComponentPatch",
    "HuntResult",
    "ImplPatch",
    "ImplementationMutant",
    "Mutant",
    "Patch",
    "during",
    "format_table",
    "hunt",
    "hunt_component",
    "hunt_implementation",
    "need",
    "wrap",
]

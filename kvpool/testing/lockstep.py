"""The lockstep harness: two memory managers driven through the same lifecycle, step by step.

The public entry point; the parts live in two modules:

- :mod:`kvpool.testing.lockstep_driver`: :class:`Lockstep` (one operation on both
  implementations, every comparison and invariant check, in a fixed detector order) and
  :class:`LockstepFailure` (the detector, the failing step and the full report);
- :mod:`kvpool.testing.lockstep_machine`: :class:`LockstepMachine`, the hypothesis state
  machine over the whole lifecycle, and the builders :func:`make_lockstep_machine` and
  :func:`make_lockstep_test` (a pytest-collectable TestCase from two factories
  ``(PoolConfig) -> MemoryManagerProtocol``).
"""

from __future__ import annotations

# Re-exports in the ``X as X`` form rather than ``__all__``: hypothesis mixes the string
# constants of local modules into its draws, and a list of names here would add some.
from kvpool.testing.lockstep_driver import ConfigDrawer as ConfigDrawer
from kvpool.testing.lockstep_driver import Factory as Factory
from kvpool.testing.lockstep_driver import Lockstep as Lockstep
from kvpool.testing.lockstep_driver import LockstepFailure as LockstepFailure
from kvpool.testing.lockstep_machine import HypothesisChooser as HypothesisChooser
from kvpool.testing.lockstep_machine import LockstepMachine as LockstepMachine
from kvpool.testing.lockstep_machine import make_lockstep_machine as make_lockstep_machine
from kvpool.testing.lockstep_machine import make_lockstep_test as make_lockstep_test

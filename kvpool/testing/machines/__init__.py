"""Component machines: one component of two implementations driven in lockstep.

:data:`TARGETS` maps each component name of ``kvpool verify --component`` to its machine:

- the lifecycles: ``manager`` (the whole lifecycle, :mod:`.lifecycle`), ``mamba_manager``
  (hybrid Mamba models only, :mod:`.mamba_manager`), ``hicache_manager`` (with the host tier
  only, :mod:`.hicache_manager`) and ``swa_manager`` (a hybrid sliding-window model,
  :mod:`.swa_manager`);
- the pools: ``allocator`` (:mod:`.allocator`), ``req_to_token_pool`` (:mod:`.table`),
  ``hybrid_req_to_token_pool`` (a hybrid model's table, Mamba slots and states,
  :mod:`.hybrid`), ``swa_allocator`` (:mod:`.swa_allocator`) and ``kv_pool`` (a KV storage
  variant and layer-wise loading, :mod:`.kv_pool`);
- the prefix trees: ``radix_cache`` (:mod:`.radix`), ``mamba_radix_cache`` (the hybrid tree
  with state checkpoints, :mod:`.mamba_tree`), ``swa_radix_cache`` (:mod:`.swa_radix`),
  ``hiradix_cache`` (the hierarchical cache with its host tier, :mod:`.hiradix`) and SGLang
  0.5.23's unified cache with each component set: ``unified_radix_cache`` (:mod:`.unified`),
  ``unified_mamba_radix_cache`` (:mod:`.unified_mamba`) and ``unified_swa_radix_cache``
  (:mod:`.unified_swa`).

A component machine is driven by :class:`~kvpool.testing.machines.base.ComponentPair`, a
lifecycle by :class:`~kvpool.testing.lockstep_driver.Lockstep` (:func:`make_pair`), through the
one campaign runner.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from kvpool.config import PoolConfig
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.allocator import AllocatorTarget
from kvpool.testing.machines.base import ComponentPair as ComponentPair
from kvpool.testing.machines.base import Outcome as Outcome
from kvpool.testing.machines.base import Target as Target
from kvpool.testing.machines.hicache_manager import HostLifecycleTarget
from kvpool.testing.machines.hiradix import HiRadixTarget
from kvpool.testing.machines.hybrid import HybridTarget
from kvpool.testing.machines.kv_pool import KVPoolTarget
from kvpool.testing.machines.lifecycle import LifecycleTarget
from kvpool.testing.machines.mamba_manager import MambaLifecycleTarget
from kvpool.testing.machines.mamba_tree import MambaTreeTarget
from kvpool.testing.machines.radix import RadixTarget
from kvpool.testing.machines.swa_allocator import SWAAllocatorTarget
from kvpool.testing.machines.swa_manager import SWALifecycleTarget
from kvpool.testing.machines.swa_radix import SWARadixTarget
from kvpool.testing.machines.table import TableTarget
from kvpool.testing.machines.unified import UnifiedRadixTarget
from kvpool.testing.machines.unified_mamba import UnifiedMambaTreeTarget
from kvpool.testing.machines.unified_swa import UnifiedSWARadixTarget
from kvpool.testing.swarm import Chooser, Op

TARGETS: dict[str, Target | LifecycleTarget] = {
    "allocator": AllocatorTarget(),
    "req_to_token_pool": TableTarget(),
    "radix_cache": RadixTarget(),
    "manager": LifecycleTarget(),
    "mamba_manager": MambaLifecycleTarget(),
    "hicache_manager": HostLifecycleTarget(),
    "hybrid_req_to_token_pool": HybridTarget(),
    "mamba_radix_cache": MambaTreeTarget(),
    "swa_allocator": SWAAllocatorTarget(),
    "swa_radix_cache": SWARadixTarget(),
    "swa_manager": SWALifecycleTarget(),
    "hiradix_cache": HiRadixTarget(),
    "kv_pool": KVPoolTarget(),
    "unified_radix_cache": UnifiedRadixTarget(),
    "unified_mamba_radix_cache": UnifiedMambaTreeTarget(),
    "unified_swa_radix_cache": UnifiedSWARadixTarget(),
}


class Pair(Protocol):
    """What the campaign runner needs of a pair of sides (component or lifecycle)."""

    coverage: Counter[str]

    @property
    def ops(self) -> list[Op]: ...

    @property
    def checks(self) -> int: ...

    def draw(self, c: Chooser) -> Op: ...

    def run(self, op: Op) -> Any: ...


def make_pair(
    target: Target | LifecycleTarget,
    impl_a: Implementation,
    impl_b: Implementation,
    config: PoolConfig,
    labels: tuple[str, str] = ("reference", "candidate"),
) -> Pair:
    """A fresh pair for ``target`` (raises LockstepFailure when the initial state is bad)."""
    if isinstance(target, LifecycleTarget):
        return target.pair(impl_a, impl_b, config, labels)
    return ComponentPair(target, impl_a, impl_b, config, labels)

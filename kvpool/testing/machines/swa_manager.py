"""The hybrid sliding-window lifecycle machine (``--component swa_manager``).

The lifecycle machine (:mod:`.lifecycle`) over each implementation's ``swa_manager``
(``SWAMemoryManager``: SWA allocator, SWA chunk cache, SWA KV pool, the window released after
every decode), on configurations the swarm draws as for the manager plus a window (below, at
and above a page) and a full-to-SWA size ratio (SWA pools smaller, equal, larger). Requests
extend (chunked too), decode, take speculative steps, finish, abort and retract; sessions are
left out (an SWA session would need its window carried across turns). Every step checks the
pool invariants, which include ``INV-SWA-WINDOW`` and, through it, every ``INV-SWA-*`` check.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from kvpool.config import PoolConfig
from kvpool.testing.bundle import Implementation
from kvpool.testing.lockstep_driver import Factory, Lockstep
from kvpool.testing.machines.lifecycle import LifecyclePair, LifecycleTarget
from kvpool.testing.swarm import KINDS, Chooser, Op, draw_config, draw_op

SWA_KINDS = tuple(k for k in KINDS if k not in ("session_turn", "open_session", "close_session"))
"""The lifecycle's operation kinds without sessions."""


def swa_manager_factory(impl: Implementation) -> Factory:
    """``impl.swa_manager`` (an implementation without one cannot be driven here)."""
    if impl.swa_manager is None:
        raise ValueError(f"{impl.label} provides no swa_manager")
    return impl.swa_manager


class SWALifecyclePair(LifecyclePair):
    """A :class:`LifecyclePair` of two SWA managers, drawing no session operation."""

    def __init__(
        self,
        impl_a: Implementation,
        impl_b: Implementation,
        config: PoolConfig,
        labels: tuple[str, str],
    ) -> None:
        self.coverage: Counter[str] = Counter()
        self.lockstep = Lockstep(
            swa_manager_factory(impl_a), swa_manager_factory(impl_b), config, labels
        )

    def draw(self, c: Chooser) -> Op:
        return draw_op(c, self.lockstep.view(), c.choice(SWA_KINDS))

    def run(self, op: Op) -> Any:
        before = self.lockstep.snap_a
        out = super().run(op)
        after = self.lockstep.snap_a
        was = {r.rid: r.swa_evicted_seqlen for r in before.reqs}
        if any(r.swa_evicted_seqlen > was.get(r.rid, 0) for r in after.reqs):
            self.coverage["decode:window-slid"] += 1
        return out


class SWALifecycleTarget(LifecycleTarget):
    """The SWA lifecycle as a campaign target (see the module docstring)."""

    name = "swa_manager"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        # no layer-wise loading: the SWA pool takes no layer steps (and the runs stay as they were)
        base = draw_config(
            c, rules=impl.rules_or_default(), disable_radix_cache=True, layerwise_loading=False
        )
        ps = base.page_size
        window = c.choice((1, max(ps // 2, 1), ps, ps + 1, 2 * ps + 3))
        ratio = c.choice((0.5, 0.8, 1.0, 1.5))
        return dataclasses.replace(base, sliding_window=window, kv_layout="mha",
                                   num_layers=max(base.num_layers, 2),
                                   swa_full_tokens_ratio=ratio)  # fmt: skip

    def pair(
        self,
        impl_a: Implementation,
        impl_b: Implementation,
        config: PoolConfig,
        labels: tuple[str, str],
    ) -> LifecyclePair:
        return SWALifecyclePair(impl_a, impl_b, config, labels)


__all__ = ["SWA_KINDS", "SWALifecyclePair", "SWALifecycleTarget", "swa_manager_factory"]

"""The hybrid sliding-window lifecycle machine (``--component swa_manager``).

The lifecycle machine (:mod:`.lifecycle`) over each implementation's ``swa_manager``
(``SWAMemoryManager``: SWA allocator, SWA chunk cache or SWA radix cache, SWA KV pool, the window
released after every decode), on configurations the swarm draws as for the manager plus a
window (below, at and above a page), a full-to-SWA size ratio (SWA pools smaller, equal,
larger) and, in half the runs, the SWA radix cache with an SWA pool smaller than the full one
(so that SWA eviction and tombstones are frequent); a radix run whose page count is 1 mod 3
keys its tree by EAGLE's bigrams when the candidate's managers model them
(``Implementation.manager_models_eagle``). Requests
extend (chunked too), decode, take speculative steps, finish, abort and retract, and streaming
sessions carry a turn's row and window to the next turn. Every step checks the
pool invariants, which include ``INV-SWA-WINDOW`` and, through it, every ``INV-SWA-*`` check.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from kvpool.config import PoolConfig
from kvpool.snapshot import NodeSnapshot, PoolSnapshot
from kvpool.testing.bundle import Implementation
from kvpool.testing.lockstep_driver import Factory, Lockstep
from kvpool.testing.machines.lifecycle import LifecyclePair, LifecycleTarget, component_misuse
from kvpool.testing.swarm import KINDS, Chooser, Op, draw_config, draw_op

_SESSION_KINDS = ("session_turn", "open_session", "close_session")
SWA_KINDS = (*(k for k in KINDS if k not in _SESSION_KINDS), "decode", "decode", *_SESSION_KINDS)
"""The lifecycle's operation kinds with more decodes (the window slides on decode) and each
session kind once."""


def swa_manager_factory(impl: Implementation) -> Factory:
    """``impl.swa_manager`` (an implementation without one cannot be driven here)."""
    if impl.swa_manager is None:
        raise ValueError(f"{impl.label} provides no swa_manager")
    return impl.swa_manager


def coarse_swa_pool(snap: PoolSnapshot, swa_locks: bool = True) -> PoolSnapshot:
    """``snap`` with its tree as the unified SWA machine compares it
    (:func:`~kvpool.testing.machines.unified_swa.coarse_swa_tree`: no access times, hit counts
    or priorities); ``swa_locks`` False (a side cannot read per-node SWA lock counts: SGLang's
    Rust core) also drops the per-node SWA locks and compares the SWA sizes' total only."""
    from kvpool.testing.machines.unified_swa import coarse_swa_tree

    if snap.tree is None:
        return snap
    if snap.tree.disabled:  # the chunk cache names no policy; SGLang's disabled tree does
        return dataclasses.replace(snap, tree=dataclasses.replace(snap.tree, eviction_policy=""))
    tree = coarse_swa_tree(snap.tree, swa_locks=swa_locks)
    if not swa_locks:
        tree = dataclasses.replace(
            tree, swa_evictable_size=tree.swa_evictable_size + tree.swa_protected_size,
            swa_protected_size=0)  # fmt: skip
    return dataclasses.replace(snap, tree=tree)


def radix_tags(before: Sequence[NodeSnapshot], after: Sequence[NodeSnapshot]) -> list[str]:
    """Coverage of the SWA radix cache inside the lifecycle: tombstones made (by an insert of
    released window slots or by SWA eviction) and recovered."""
    tomb_before = {n.node_id for n in before if n.swa_tombstone}
    tomb_after = {n.node_id for n in after if n.swa_tombstone}
    ids_after = {n.node_id for n in after}
    tags = ["radix:tombstoned"] if tomb_after - tomb_before else []
    if (tomb_before - tomb_after) & ids_after:
        tags.append("radix:recovered")
    return tags


class SWALifecyclePair(LifecyclePair):
    """A :class:`LifecyclePair` of two SWA managers."""

    def __init__(
        self,
        impl_a: Implementation,
        impl_b: Implementation,
        config: PoolConfig,
        labels: tuple[str, str],
    ) -> None:
        self.coverage: Counter[str] = Counter()
        # SGLang's unified trees (0.5.23's; 0.5.16's, Rules.swa_tree "unified") report no times,
        # hit counts or priorities, and 0.5.23's Rust core no per-node SWA lock counts: compare
        # as the unified SWA machine does (kvpool's own twins under those rules: exactly)
        rules = impl_b.rules or config.rules
        unified = (rules.swa_window_release == "scheduler" or rules.swa_tree == "unified") and (
            impl_a.coarse_unified_tree or impl_b.coarse_unified_tree
        )
        self._swa_locks = True
        self.lockstep = Lockstep(
            swa_manager_factory(impl_a), swa_manager_factory(impl_b), config, labels,
            normalize=self._normalize if unified else None,
        )  # fmt: skip
        # set once both sides are built (the first comparison comes after the first step)
        self._swa_locks = all(
            getattr(m.tree_cache, "swa_lock_counts_readable", True)
            for m in (self.lockstep.a, self.lockstep.b)
        )
        self.reachability = impl_b.reachability
        self.rejects_misuse = (impl_b.rules or config.rules).rejects_misuse
        # EAGLE v1 draft borrowing restores the allocator (backup_state / restore_state): one
        # that restores only its free lists keeps stale mapping entries (SGLang 0.5.16,
        # Rules.swa_restore_mapping False), which a harness must not provoke
        self.restores_mapping = (impl_b.rules or config.rules).swa_restore_mapping
        self.stops = impl_b.manager_models_stops
        """Whether finishes may stop a request early (``View.stops``), less than a window
        before its last token (``View.stop_span``: a longer overshoot is not modelled)."""
        assert config.sliding_window is not None
        self._stop_span = min(7, config.sliding_window - 1)

    def _normalize(self, snap: PoolSnapshot) -> PoolSnapshot:
        return coarse_swa_pool(snap, self._swa_locks)

    def draw(self, c: Chooser) -> Op:
        view = self.lockstep.view()
        view.stops, view.stop_span = self.stops, self._stop_span
        op = draw_op(c, view, c.choice(SWA_KINDS))
        while (not self.rejects_misuse and component_misuse(op)) or (  # SGLang accepts it
            not self.restores_mapping and op.name == "spec_draft_v1"
        ):
            op = draw_op(c, view, c.choice(SWA_KINDS))
        return op

    def run(self, op: Op) -> Any:
        before = self.lockstep.snap_a
        out = super().run(op)
        after = self.lockstep.snap_a
        was = {r.rid: r.swa_evicted_seqlen for r in before.reqs}
        if any(r.swa_evicted_seqlen > was.get(r.rid, 0) for r in after.reqs):
            self.coverage["decode:window-slid"] += 1
            if op.name == "spec_step":  # SGLang 0.5.23's eagle_prepare_for_decode slides too
                self.coverage["spec_step:window-slid"] += 1
        slid = {s.session_id for s in before.sessions if s.row and s.swa_evicted_seqlen}
        if any(s.session_id in slid and not s.row for s in after.sessions):
            self.coverage["session:window-carried"] += 1
        if not after.tree.disabled:
            self.coverage.update(radix_tags(before.tree.nodes, after.tree.nodes))
        return out


class SWALifecycleTarget(LifecycleTarget):
    """The SWA lifecycle as a campaign target (see the module docstring)."""

    name = "swa_manager"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        base = draw_config(c, rules=impl.rules_or_default(), disable_radix_cache=True)
        ps = base.page_size
        window = c.choice((1, max(ps // 2, 1), ps, ps + 1, 2 * ps + 3))
        ratio = c.choice((0.5, 0.8, 1.0, 1.5))
        # the SWA radix cache in half the runs; its small SWA pools make SWA eviction frequent
        radix = bool(c.integer(0, 1))
        if radix:
            ratio = min(ratio, c.choice((0.5, 0.8)))
        base = dataclasses.replace(base, disable_radix_cache=not radix)
        rules = base.rules
        if rules.swa_window_release == "scheduler":
            # SGLANG_SWA_EVICTION_INTERVAL is a server setting: draw small ones so that windows
            # slide within a run's short requests
            interval = c.choice((1, 2, ps, 2 * ps + 1))
            base = dataclasses.replace(base, rules=dataclasses.replace(
                rules, swa_eviction_interval=interval))  # fmt: skip
        # EAGLE's bigram keys for a radix run whose page count is 1 mod 3, when the candidate's
        # managers model them: no extra draw
        eagle = impl.manager_models_eagle and radix and (base.size // ps) % 3 == 1
        base = dataclasses.replace(base, is_eagle=eagle)
        # SWA models keep their KV in SWAKVPool (check_swa_config refuses a storage variant)
        return dataclasses.replace(base, sliding_window=window, kv_layout="mha", kv_storage="plain",
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


__all__ = [
    "SWA_KINDS",
    "SWALifecyclePair",
    "SWALifecycleTarget",
    "radix_tags",
    "swa_manager_factory",
]

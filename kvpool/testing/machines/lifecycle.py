"""The lifecycle machine (``--component manager``) behind the same interface as the components.

It wraps :class:`~kvpool.testing.lockstep_driver.Lockstep` (two memory managers stepped
through the request lifecycle). An implementation that provides components but no manager is
run inside the torch twin's ``MemoryManager`` with its components injected
(:mod:`kvpool.injection`), so every part of the manager holds the candidate's objects.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from kvpool.config import PoolConfig
from kvpool.errors import OutOfMemoryError
from kvpool.records import replaced
from kvpool.snapshot import PoolSnapshot
from kvpool.testing.bundle import Implementation
from kvpool.testing.layer_ops import draw_lifecycle_op, layer_fields
from kvpool.testing.lockstep_driver import Factory, Lockstep, LockstepFailure
from kvpool.testing.machines.coverage import outcome_tag
from kvpool.testing.machines.hiradix import coarse_host_tier
from kvpool.testing.machines.mamba_lifecycle import mamba_radix_tags
from kvpool.testing.machines.unified import coarse_tree
from kvpool.testing.machines.unified_mamba import coarse_mamba_tree
from kvpool.testing.swarm import HOST_KINDS, KINDS, Chooser, Op, draw_config


def manager_factory(impl: Implementation, unified: bool = False) -> Factory:
    """``impl.manager``, or the torch twin's manager built around ``impl``'s components. With
    ``unified`` the manager's tree is ``impl.unified_radix_cache`` (SGLang 0.5.23's server
    default): injected into ``impl.manager``, or the lifecycle's tree when ``impl`` has no
    manager of its own."""
    if impl.manager is not None:
        if unified and impl.unified_radix_cache is not None:
            # a manager takes its components by keyword (kvpool.injection)
            manager: Any = impl.manager
            tree = impl.unified_radix_cache

            def with_tree(config: PoolConfig) -> Any:
                if (
                    config.disable_radix_cache
                    or config.mamba_slots is not None
                    or config.enable_hierarchical_cache
                ):
                    return manager(config)
                return manager(config, tree_cache=tree)

            return with_tree
        return impl.manager

    def build(config: PoolConfig) -> Any:
        from kvpool.optimized.lifecycle.memory_manager import MemoryManager

        parts: dict[str, Any] = {}
        if impl.allocator is not None:
            parts["token_to_kv_pool_allocator"] = impl.allocator
        if impl.req_to_token_pool is not None:
            parts["req_to_token_pool"] = impl.req_to_token_pool
        tree = impl.unified_radix_cache if unified else impl.radix_cache
        if tree is not None and not config.disable_radix_cache:
            parts["tree_cache"] = tree
        return MemoryManager(config, checked=True, **parts)  # a kvpool tool: checked on

    return build


def coarse_pool(snap: PoolSnapshot) -> PoolSnapshot:
    """``snap`` with its tree as the unified machine compares it
    (:func:`~kvpool.testing.machines.unified.coarse_tree`); with a host tier, its tree and host
    tier as the hiradix machine compares a unified one
    (:func:`~kvpool.testing.machines.hiradix.coarse_host_tier`)."""
    if snap.tree is None:
        return snap
    if snap.host is not None:  # a host tier: its tree and transfers as the hiradix machine's
        host = coarse_host_tier(snap.host)
        return replaced(snap, tree=host.tree, host=host)
    coarse = replaced(snap, tree=coarse_tree(snap.tree))
    if snap.mamba is not None and snap.mamba.tree is not None:  # a hybrid model's Mamba tree
        mamba = replaced(snap.mamba, tree=coarse_mamba_tree(snap.mamba.tree))
        coarse = replaced(coarse, mamba=mamba)
    return coarse


def without_kv_order(snap: PoolSnapshot) -> PoolSnapshot:
    """``snap`` as a lockstep against SGLang 0.5.16's FULL+MAMBA ``UnifiedRadixCache``
    compares it: its tree as the unified machine does (:func:`coarse_tree`: nodes
    breadth-first, children in id order, no access times) and its Mamba tree likewise, without
    the KV recency order (``full_lru``: 0.5.16's FULL component keeps none, it evicts from a
    heap of access times) but with the state order (the MAMBA component's LRU list). The KV
    order is still compared through what the evictions free."""
    if snap.tree is None or snap.mamba is None or snap.mamba.tree is None:
        return snap
    tree = snap.mamba.tree
    mamba_tree = replaced(coarse_mamba_tree(tree), mamba_lru=tree.mamba_lru)
    mamba = replaced(snap.mamba, tree=mamba_tree)
    return replaced(snap, tree=coarse_tree(snap.tree), mamba=mamba)


def coarse_hybrid(snap: PoolSnapshot) -> PoolSnapshot:
    """:func:`coarse_pool` for a hybrid model's snapshot (one with a Mamba tree), else ``snap``
    as it is: the lifecycle's normalisation when only the Mamba tree is SGLang's unified one."""
    if snap.mamba is None or snap.mamba.tree is None:
        return snap
    return coarse_pool(snap)


def _unified_hybrid(impl: Implementation) -> bool:
    """Whether ``impl`` has a unified FULL+MAMBA tree and no legacy Mamba tree (SGLang 0.5.23
    removed it): a hybrid model's lifecycle runs over the unified tree even when the FULL
    lifecycle takes the legacy one (``+legacy-tree``): :func:`coarse_hybrid`."""
    return impl.mamba_radix_cache is None and impl.unified_mamba_radix_cache is not None


def _keeps_no_kv_order(impl: Implementation) -> bool:
    """Whether ``impl`` is SGLang with 0.5.16's unified Mamba tree in the lifecycle (its rules
    pair the unified tree with 0.5.16's release, its snapshot is a tree core's):
    :func:`without_kv_order`."""
    rules = impl.rules
    return (
        impl.coarse_unified_tree
        and rules is not None
        and (rules.mamba_tree, rules.release_path) == ("unified", "finished_req")
    )


class LifecyclePair:
    """A :class:`Lockstep` with the component pairs' interface (``draw``, ``run``,
    ``coverage``)."""

    reachability: Callable[[PoolConfig, Sequence[Any]], str] | None = None
    """The candidate's :attr:`~kvpool.testing.bundle.Implementation.reachability` (None: no
    line in failure reports)."""

    def __init__(
        self,
        impl_a: Implementation,
        impl_b: Implementation,
        config: PoolConfig,
        labels: tuple[str, str],
    ) -> None:
        self.coverage: Counter[str] = Counter()
        unified = impl_a.unified_lifecycle or impl_b.unified_lifecycle
        normalize: Callable[[PoolSnapshot], PoolSnapshot] | None = None
        if unified and (impl_a.coarse_unified_tree or impl_b.coarse_unified_tree):
            normalize = coarse_pool
        elif _unified_hybrid(impl_b):
            normalize = coarse_hybrid
        elif _keeps_no_kv_order(impl_b):
            normalize = without_kv_order
        self.lockstep = Lockstep(
            manager_factory(impl_a, unified), manager_factory(impl_b, unified), config, labels,
            normalize=normalize,
        )  # fmt: skip
        self.reachability = impl_b.reachability
        self.stops = impl_b.manager_models_stops
        """Whether finishes may stop a request early (``View.stops``; a hybrid model's session
        turns never do: ``View.session_stops``)."""
        self.rejects_misuse = (impl_b.rules or config.rules).rejects_misuse
        """False when the candidate's rules say its components accept misuse silently (SGLang):
        then no invalid call that only a component would refuse is drawn (see
        :func:`component_misuse`)."""

    @property
    def ops(self) -> list[Op]:
        return self.lockstep.ops

    @property
    def checks(self) -> int:
        return self.lockstep.checks

    def draw(self, c: Chooser) -> Op:
        view, layers = self.lockstep.view(), self.lockstep.layers
        view.stops, view.session_stops = self.stops, view.config.mamba_slots is None
        kinds = KINDS + HOST_KINDS if view.config.enable_hierarchical_cache else KINDS
        op = draw_lifecycle_op(c, view, layers, c.choice(kinds))
        while not self.rejects_misuse and component_misuse(op):
            op = draw_lifecycle_op(c, view, layers, c.choice(kinds))
        return op

    def run(self, op: Op) -> Any:
        before = self.lockstep.snap_a
        calls: list[Counter[str]] = getattr(self.lockstep.b, "glue_calls", [])
        counted = [dict(c) for c in calls]
        try:
            out = self.lockstep.run(op)
        except LockstepFailure as failure:
            if self.reachability is None:
                raise
            line = f"reachability: {self.reachability(self.lockstep.config, self.lockstep.ops)}"
            raise LockstepFailure(failure.detector, failure.step, f"{failure}\n{line}",
                                  failure.indices) from failure  # fmt: skip
        finally:
            for now, then in zip(calls, counted, strict=True):
                for name, n in now.items():
                    if n > then.get(name, 0):  # SGLang glue functions the candidate ran
                        self.coverage[f"sglang:{name}"] += n - then.get(name, 0)
        error = out if isinstance(out, BaseException) else None
        self.coverage.update(lifecycle_tags(op, out, error, before, self.lockstep.snap_a))
        return out


def component_misuse(op: Op) -> bool:
    """An invalid lifecycle call that the manager passes to a component unchecked, so that only
    a component with ``Rules.rejects_misuse`` refuses it: ``evict`` of a negative count (the
    manager's ``evict`` is the tree's)."""
    return op.expect_error and op.name == "evict"


def lifecycle_tags(
    op: Op, result: Any, error: BaseException | None, before: PoolSnapshot, after: PoolSnapshot
) -> list[str]:
    """Coverage tags of one lifecycle step."""
    if isinstance(error, OutOfMemoryError) and not op.expect_error:
        return [f"{op.name}:oom", *mamba_radix_tags(op.name, error, before, after)]
    tags = [outcome_tag(op, None if error else result, error)]
    if op.name in ("abort", "retract") and op.expect_error:
        tags.append(f"invalid:{op.name}")
    if error is not None:
        return tags
    if op.name == "new_req" and dict(op.kwargs).get("session_id"):
        tags.append("session:turn")
    if op.name == "extend":
        if any(r.is_chunked for r in after.reqs):
            tags.append("extend:chunked")
        if len(after.tree.nodes) < len(before.tree.nodes):
            tags.append("extend:evicted")
        sessions = {r.rid for r in before.reqs if r.session_id and r.state == "waiting"}
        if sessions & set(op.args[0]):
            tags.append("session:restore")
            if after.mamba is not None:
                tags.append("session:hybrid-restore")
    if op.name in ("decode", "spec_step") and len(after.tree.nodes) < len(before.tree.nodes):
        tags.append(f"{op.name}:evicted")  # the allocation had to evict first
    if op.name == "finish":
        tags += _stop_tags(op, before)
    if before.allocator.release_pages and not after.allocator.release_pages:
        tags.append("merge:by-alloc")
    tags += mamba_radix_tags(op.name, error, before, after)
    return tags + host_tags(op, result, before, after)


def _stop_tags(op: Op, before: PoolSnapshot) -> list[str]:
    """``finish:stop-inside`` (a session turn's: ``session:stop-inside``) for each request a
    finish stopped before its last committed token."""
    stops = dict(op.kwargs).get("finished_lens")
    if not stops:
        return []
    reqs = {r.rid: r for r in before.reqs}
    tags = []
    for rid, stop in zip(op.args[0], stops, strict=False):
        req = reqs.get(rid)
        if req is not None and stop is not None and req.input_len + stop < req.kv_committed_len:
            tags.append("session:stop-inside" if req.session_id else "finish:stop-inside")
    return tags


def host_tags(op: Op, result: Any, before: PoolSnapshot, after: PoolSnapshot) -> list[str]:
    """Coverage tags of the host tier in one successful lifecycle step."""
    if before.host is None or after.host is None:
        return []
    tags: list[str] = []
    if op.name.startswith("hicache_ack_"):
        tags.append(f"{op.name}:{'acked' if result else 'nothing'}")
    loads = sum(t.kind == "load" for t in after.host.transfers)
    if op.name in ("match_prefix", "extend") and loads > sum(
        t.kind == "load" for t in before.host.transfers
    ):
        tags.append("host:load-back")
    if sum(n.evicted for n in after.host.tree.nodes) > sum(
        n.evicted for n in before.host.tree.nodes
    ):
        tags.append("host:to-host-only")
    if op.name == "finish" and len(after.host.transfers) > len(before.host.transfers):
        tags.append("host:write-issued")
    if op.name in ("abort", "retract") and before.host.transfers:
        tags.append(f"host:{op.name}-in-flight")
    return tags


class LifecycleTarget:
    """The lifecycle as a campaign target (see the module docstring)."""

    name = "manager"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        # Hybrid lifecycles need a whole manager that runs them: the twin's manager built around
        # another implementation's components (manager_factory) has no Mamba steps over them.
        hybrid = (
            impl.hybrid_req_to_token_pool is not None
            and impl.manager is not None
            and impl.manager_runs_hybrid
        )
        # the host tier lives in the implementation's own manager: 0.5.16's host tier, or
        # 0.5.23's inside the unified cache (SGLang's glue over it: kvpool.sglang.glue_hicache)
        host = impl.manager is not None and impl.provides("hiradix_cache")
        config = draw_config(c, hybrid=hybrid, host=host, eagle=impl.manager_models_eagle,
                             rules=impl.rules_or_default())  # fmt: skip
        return dataclasses.replace(config, **layer_fields(config))

    def pair(
        self,
        impl_a: Implementation,
        impl_b: Implementation,
        config: PoolConfig,
        labels: tuple[str, str],
    ) -> LifecyclePair:
        return LifecyclePair(impl_a, impl_b, config, labels)


__all__ = [
    "LifecyclePair",
    "LifecycleTarget",
    "component_misuse",
    "host_tags",
    "lifecycle_tags",
    "manager_factory",
]

"""The unified Mamba machine: SGLang's ``UnifiedRadixCache`` with FULL and MAMBA (0.5.23's, and
0.5.16's under ``Rules.for_sglang("0.5.16")``).

The Mamba radix-cache machine's operations, draws and model
(:class:`~kvpool.testing.machines.mamba_tree.MambaTreeTarget`: inserts carrying a state slot,
matches with copy-on-write that lock their node while the request runs, copies, forwards,
releases, evictions of KV and states) over the implementation's ``unified_mamba_radix_cache``
factory (kvpool's :class:`~kvpool.reference.unified.mamba_radix_cache.UnifiedMambaRadixCache`,
its twin, or SGLang's own cache: 0.5.23's over either tree core, 0.5.16's). After every step
the Mamba invariants (slot accounting, checkpoints, state integrity), the unified tree's
invariants (:mod:`kvpool.invariants.unified_mamba_tree`: tombstone leaves and tombstone locks
allowed) and the token allocator's accounting run on both sides.

The direct locks reach the Mamba lock's two semantics (``Rules.unified_tombstone_lock``): a lock
on a tombstone counted (0.5.23: ``lock_node:tombstone`` then ``evict:locked-tombstone``,
``insert:revived-locked``) or skipped (0.5.16: the tombstone revived under the KV lock alone,
``insert:revived-kv-locked``, and its state evicted from a KV-locked leaf,
``evict:kv-locked-leaf``).

Trees are compared by :func:`coarse_mamba_tree`: the same nodes (breadth-first, children in id
order), keys, KV slots, state slots, both lock counts and the four sizes, without the LRU
orders (SGLang's Rust core does not expose them; an order they decide shows in which slots and
states an eviction frees).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.invariants.allocator import check_allocator
from kvpool.invariants.mamba import MambaContext, MambaReqView, check_mamba
from kvpool.invariants.unified_mamba_tree import check_unified_mamba_tree
from kvpool.records import replaced
from kvpool.snapshot import MambaNodeSnapshot, MambaTreeSnapshot
from kvpool.testing import report
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.hybrid import MachineMambaReq
from kvpool.testing.machines.mamba_tree import MambaTreeTarget, TreeSide, TreeSideSnapshot
from kvpool.testing.machines.mamba_tree_model import TreeModel, observe_tree, tree_coverage
from kvpool.testing.swarm import Chooser, Op


def coarse_mamba_tree(tree: MambaTreeSnapshot) -> MambaTreeSnapshot:
    """``tree`` as the unified Mamba machine compares it: nodes breadth-first with children in
    id order, no LRU orders."""
    by_id = {n.node_id: n for n in tree.nodes}
    rows: list[MambaNodeSnapshot] = []
    queue = [tree.nodes[0]] if tree.nodes else []
    while queue:
        node = queue.pop(0)
        kids = tuple(sorted(node.child_ids))
        queue.extend(by_id[k] for k in kids)
        rows.append(replaced(node, child_ids=kids))
    return replaced(tree, nodes=tuple(rows), full_lru=(), mamba_lru=())


@dataclass
class UnifiedTreeModel(TreeModel):
    """The Mamba machine's model plus the nodes locked directly (``lock_node``), in lock order
    (a node locked twice is listed twice)."""

    node_locks: list[int] = field(default_factory=list)


def _node(side: TreeSide, node_id: int) -> Any:
    """The node ``node_id`` of either kind of tree (kvpool's nodes or SGLang's ids)."""
    finder = getattr(side.tree, "node_by_id", None)
    return finder(node_id) if finder is not None else side.node(node_id)


class UnifiedMambaTreeTarget(MambaTreeTarget):
    """:class:`~kvpool.testing.machines.base.Target` of 0.5.23's FULL + MAMBA unified tree."""

    name = "unified_mamba_radix_cache"

    def build(self, impl: Implementation, config: PoolConfig) -> TreeSide:
        factory = impl.unified_mamba_radix_cache
        assert factory is not None and impl.hybrid_req_to_token_pool is not None
        assert impl.allocator is not None
        pool, kv = impl.hybrid_req_to_token_pool(config), impl.allocator(config)
        return TreeSide(pool, kv, factory(config, pool, kv), impl)

    def snapshot(self, side: TreeSide) -> TreeSideSnapshot:
        return TreeSideSnapshot(side.pool.hybrid_snapshot(), side.kv.snapshot(),
                                coarse_mamba_tree(side.tree.snapshot()))  # fmt: skip

    def new_model(self, config: PoolConfig) -> UnifiedTreeModel:
        return UnifiedTreeModel(config)

    def draw_op(self, c: Chooser, model: TreeModel, rejects_misuse: bool) -> Op:
        """The Mamba machine's draws, plus one in eight a direct lock or unlock of a node (a
        tombstone too: 0.5.23's Mamba lock counts it, 0.5.16's skips it)."""
        if c.integer(0, 7) == 0:
            return Op(c.choice(("lock_node", "unlock_node")), (c.integer(0, 15),))
        return super().draw_op(c, model, rejects_misuse)

    def materialize(self, model: TreeModel, op: Op) -> Op | None:
        if op.name == "lock_node":
            nodes = [n.node_id for n in (model.tree.nodes[1:] if model.tree else ())]
            return Op("lock_node", (nodes[op.args[0] % len(nodes)],)) if nodes else None
        if op.name == "unlock_node":
            assert isinstance(model, UnifiedTreeModel)
            held = model.node_locks
            return Op("unlock_node", (held[op.args[0] % len(held)],)) if held else None
        return super().materialize(model, op)

    def observe(self, model: TreeModel, op: Op, out: Outcome) -> None:
        if op.name not in ("lock_node", "unlock_node"):
            observe_tree(model, op, out)
            return
        model.tree = out.after.tree
        if out.error is None and isinstance(model, UnifiedTreeModel):
            if op.name == "lock_node":
                model.node_locks.append(op.args[0])
            else:
                model.node_locks.remove(op.args[0])

    def call(self, side: TreeSide, op: Op) -> Any:
        """As the Mamba machine's, with nodes compared by id (SGLang's are ints), and the
        direct locks."""
        tree = side.tree
        if op.name == "lock_node":
            return tree.inc_lock_ref(_node(side, op.args[0]))
        if op.name == "unlock_node":
            return tree.dec_lock_ref(_node(side, op.args[0]))
        if op.name == "match":
            rid, tokens, extra, cow = op.args
            req = MachineMambaReq()
            res = tree.match_prefix(side.key(tokens, extra), req, cow)
            node = res.last_device_node
            if cow and node.node_id != 0:
                tree.inc_lock_ref(node)  # the scheduler locks the matched node while it runs
                side.locked[rid] = node
                side.reqs[rid] = req
            return (report.normalize(res.device_indices), node.node_id, res.cow_staged,
                    req.mamba_pool_idx)  # fmt: skip
        if op.name == "invalid" and op.args[0] == "dec-unlocked":
            return tree.dec_lock_ref(_node(side, op.args[1]))
        return super().call(side, op)

    def check(self, model: TreeModel, snap: Any, previous: Any) -> int:
        views = tuple(MambaReqView(f"req {rid}", None, r.slot, (), r.expected_tag)
                      for rid, r in sorted(model.reqs.items()) if r.slot is not None)  # fmt: skip
        checkpoints = tuple((s, model.ckpt_tags[s]) for s in sorted(model.tree_slots))
        count = check_mamba(snap.pool, MambaContext(views, checkpoints))
        count += check_unified_mamba_tree(snap.tree)
        held = {v for n in snap.tree.nodes for v in n.value}
        return count + check_allocator(snap.kv, held)

    def coverage(self, model: TreeModel, op: Op, out: Outcome) -> list[str]:
        if op.name in ("lock_node", "unlock_node"):
            tags = [f"{op.name}:ok" if out.error is None else f"{op.name}:error"]
            node = next(n for n in out.before.tree.nodes if n.node_id == op.args[0])
            if node.mamba_value is None:
                tags.append(f"{op.name}:tombstone")
            return tags
        tags = tree_coverage(model, op, out)
        if op.expect_error or out.error is not None or op.name not in ("evict", "insert"):
            return tags
        after = out.after.tree
        if op.name == "insert" and out.result is not None and not out.result[1]:
            before = {n.node_id: n for n in out.before.tree.nodes}
            revived = [
                n
                for n in after.nodes[1:]
                if n.node_id in before
                and before[n.node_id].mamba_value is None
                and n.mamba_value is not None
            ]
            if any(n.mamba_lock_ref for n in revived):
                tags.append("insert:revived-locked")
            if any(n.full_lock_ref and not n.mamba_lock_ref for n in revived):
                tags.append("insert:revived-kv-locked")
        if op.name == "evict":
            before = {n.node_id: n for n in out.before.tree.nodes}
            held = {i for i, n in before.items() if n.mamba_value is not None}
            pinned = [n for n in after.nodes[1:] if not n.child_ids and n.full_lock_ref
                      and n.mamba_value is None and n.node_id in held]  # fmt: skip
            if pinned:  # a state evicted from a KV-locked leaf (0.5.16's skipped lock)
                tags.append("evict:kv-locked-leaf")
        if any(not n.child_ids and n.mamba_value is None for n in after.nodes[1:]):
            tags.append(f"{op.name}:tombstone-leaf")
        if any(n.mamba_value is None and n.mamba_lock_ref for n in after.nodes[1:]):
            tags.append(f"{op.name}:locked-tombstone")
        return tags


__all__ = ["UnifiedMambaTreeTarget", "coarse_mamba_tree"]

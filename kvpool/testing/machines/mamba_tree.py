"""The MambaRadixCache machine: inserts, matches with copy-on-write, locks, forwards, evictions.

Each side is a hybrid pool, a token allocator (page size 1) and a ``MambaRadixCache`` over them,
built by the implementation's factories. An insert caches a sequence's KV and the state its
tokens produced (written with its tag first, as the forward would); a match gives a request a
copy of the deepest cached state (locking the node, as the scheduler does while the request
runs); a forward copies it and writes the request's next state; a release unlocks and frees the
request's slot; evictions take KV and states. After every step the Mamba invariants (slot
accounting across tree, requests and free list; checkpoints never written in place; state
integrity), the tree's invariants and the token allocator's accounting (the tree holds every
allocated token slot) run on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.invariants.allocator import check_allocator
from kvpool.invariants.mamba import MambaContext, MambaReqView, check_mamba
from kvpool.invariants.mamba_tree import check_mamba_tree
from kvpool.snapshot import AllocatorSnapshot, HybridReqToTokenSnapshot, MambaTreeSnapshot
from kvpool.testing import report
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.hybrid import MachineMambaReq
from kvpool.testing.machines.mamba_tree_model import (
    TreeModel,
    draw_tree_op,
    materialize_tree,
    observe_tree,
    tree_coverage,
)
from kvpool.testing.swarm import Chooser, Op


@dataclass(frozen=True)
class TreeSideSnapshot:
    pool: HybridReqToTokenSnapshot
    kv: AllocatorSnapshot
    tree: MambaTreeSnapshot


@dataclass
class TreeSide:
    pool: Any
    kv: Any
    tree: Any
    impl: Implementation
    reqs: dict[int, MachineMambaReq] = field(default_factory=dict)
    locked: dict[int, Any] = field(default_factory=dict)

    def key(self, tokens: list[int], extra: str | None) -> Any:
        assert self.impl.radix_key is not None
        return self.impl.radix_key(tokens, extra)

    def node(self, node_id: int) -> Any:
        stack = [self.tree.root_node]
        while stack:
            node = stack.pop()
            if node.node_id == node_id:
                return node
            stack.extend(node.children.values())
        raise AssertionError(f"no node {node_id}")


class MambaTreeTarget:
    """:class:`~kvpool.testing.machines.base.Target` of the Mamba radix-cache machine."""

    name = "mamba_radix_cache"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        rules = impl.rules_or_default()
        return PoolConfig(size=c.integer(8, 40), req_pool_size=4, max_context_len=16,
                          mamba_slots=c.integer(2, 8), rules=rules)  # fmt: skip

    def build(self, impl: Implementation, config: PoolConfig) -> TreeSide:
        assert impl.mamba_radix_cache is not None and impl.hybrid_req_to_token_pool is not None
        assert impl.allocator is not None
        pool, kv = impl.hybrid_req_to_token_pool(config), impl.allocator(config)
        return TreeSide(pool, kv, impl.mamba_radix_cache(config, pool, kv), impl)

    def snapshot(self, side: TreeSide) -> TreeSideSnapshot:
        return TreeSideSnapshot(side.pool.hybrid_snapshot(), side.kv.snapshot(),
                                side.tree.snapshot())  # fmt: skip

    def new_model(self, config: PoolConfig) -> TreeModel:
        return TreeModel(config)

    def pretty(self, snap: Any) -> str:
        return repr(snap)

    def draw_op(self, c: Chooser, model: TreeModel, rejects_misuse: bool) -> Op:
        return draw_tree_op(c, rejects_misuse)

    def materialize(self, model: TreeModel, op: Op) -> Op | None:
        return materialize_tree(model, op)

    def call(self, side: TreeSide, op: Op) -> Any:
        pool, tree, steps = side.pool, side.tree, side.impl.mamba_steps
        if op.name == "insert":
            tokens, extra, tag = op.args
            value = side.kv.alloc(len(tokens))
            if value is None:
                return None
            slot = pool.mamba_allocator.alloc(1)
            if slot is None:
                tree.evict_mamba(1)
                slot = pool.mamba_allocator.alloc(1)
            if slot is None:
                side.kv.free(value)
                return None
            pool.mamba_pool.write_state(slot, [tag])  # the state these tokens produced
            prefix, exist = tree.insert(side.key(tokens, extra), value, slot[0])
            if exist:
                pool.mamba_allocator.free(slot)
            return prefix, exist, report.normalize(slot)
        if op.name == "match":
            rid, tokens, extra, cow = op.args
            req = MachineMambaReq()
            res = tree.match_prefix(side.key(tokens, extra), req, cow)
            node = res.last_device_node
            if cow and node is not tree.root_node:
                tree.inc_lock_ref(node)  # the scheduler locks the matched node while it runs
                side.locked[rid] = node
                side.reqs[rid] = req
            return (report.normalize(res.device_indices), node.node_id, res.cow_staged,
                    req.mamba_pool_idx)  # fmt: skip
        if op.name == "copy":
            return steps.prepare_forward(pool, [side.reqs[op.args[0]]])
        if op.name == "forward":
            return steps.forward_state(pool, [side.reqs[op.args[0]]], [op.args[1]])
        if op.name == "release":
            rid = op.args[0]
            node = side.locked.pop(rid, None)
            if node is not None:
                tree.dec_lock_ref(node)
            req = side.reqs.pop(rid)
            return report.normalize(steps.release_waiting(pool, req))
        if op.name == "evict":
            return tree.evict(*op.args)
        kind = op.args[0]
        if kind == "dec-unlocked":
            return tree.dec_lock_ref(side.node(op.args[1]))
        if kind == "insert-mismatch":
            return tree.insert(side.key([1, 2], None), side.impl.index([1]), 1)
        return tree.evict(-1, 0)

    def observe(self, model: TreeModel, op: Op, out: Outcome) -> None:
        observe_tree(model, op, out)

    def check(self, model: TreeModel, snap: Any, previous: Any) -> int:
        views = tuple(MambaReqView(f"req {rid}", None, r.slot, (), r.expected_tag)
                      for rid, r in sorted(model.reqs.items()) if r.slot is not None)  # fmt: skip
        checkpoints = tuple((s, model.ckpt_tags[s]) for s in sorted(model.tree_slots))
        count = check_mamba(snap.pool, MambaContext(views, checkpoints))
        count += check_mamba_tree(snap.tree)
        held = {v for n in snap.tree.nodes for v in n.value}
        return count + check_allocator(snap.kv, held)

    def refusal_must_not_change(self, config: PoolConfig, op: Op, out: Outcome) -> bool:
        return out.error is not None

    def coverage(self, model: TreeModel, op: Op, out: Outcome) -> list[str]:
        return tree_coverage(model, op, out)


__all__ = ["MambaTreeTarget", "TreeSide", "TreeSideSnapshot"]

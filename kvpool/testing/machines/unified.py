"""The unified-radix-cache machine: SGLang 0.5.23's ``UnifiedRadixCache`` (FULL component).

For the FULL component set the unified cache promises what the legacy radix cache promises
(specs/unified_cache.md), so kvpool models it with the same reference ``RadixCache`` and the
radix machine's operations, draws and invariants (:class:`~kvpool.testing.machines.radix.
RadixTarget`): a side is built from the implementation's ``unified_radix_cache`` factory where
it has one (SGLang 0.5.23, either tree core), else from its ``radix_cache`` (kvpool's twins).

Trees are compared by :func:`coarse_tree`: the same nodes, keys, values, locks, parents and
sizes, children in id order, without access times, hit counts and priorities (SGLang's Rust
core does not expose them; an order they decide shows in which slots an eviction frees, which
the allocator snapshot compares).
"""

from __future__ import annotations

from typing import Any

from kvpool.config import PoolConfig
from kvpool.records import replaced
from kvpool.snapshot import NodeSnapshot, TreeSnapshot
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.radix import RadixSide, RadixSnapshot, RadixTarget, insert_span
from kvpool.testing.swarm import Op


def coarse_tree(tree: TreeSnapshot) -> TreeSnapshot:
    """``tree`` as the unified machine compares it: nodes in breadth-first order with
    children in id order, no access time, hit count, priority or policy name."""
    by_id = {n.node_id: n for n in tree.nodes}
    rows: list[NodeSnapshot] = []
    queue = [tree.nodes[0]] if tree.nodes else []
    while queue:
        node = queue.pop(0)
        order = sorted(range(len(node.child_ids)), key=lambda i: node.child_ids[i])
        kids = tuple(node.child_ids[i] for i in order)
        queue.extend(by_id[k] for k in kids)
        rows.append(replaced(
            node, child_ids=kids, child_keys=tuple(node.child_keys[i] for i in order),
            last_access_time=0.0, hit_count=0, priority=0,
        ))  # fmt: skip
    return replaced(tree, nodes=tuple(rows), eviction_policy="")


class UnifiedRadixTarget(RadixTarget):
    """:class:`~kvpool.testing.machines.base.Target` of the unified radix cache (FULL)."""

    name = "unified_radix_cache"

    def build(self, impl: Implementation, config: PoolConfig) -> RadixSide:
        assert impl.allocator and impl.req_to_token_pool and impl.radix_key
        factory = impl.unified_radix_cache
        assert factory is not None
        pool, alloc = impl.req_to_token_pool(config), impl.allocator(config)
        return RadixSide(pool, alloc, factory(config, pool, alloc), impl.radix_key, impl.index,
                         eagle=config.is_eagle)  # fmt: skip

    def call(self, side: RadixSide, op: Op) -> Any:
        """As the radix machine, except that the unified tree frees an insert's duplicate
        slots itself (``prev_prefix_len`` 0: none of the slots came from the tree)."""
        if op.name != "insert":
            return super().call(side, op)
        tokens, extra = op.args[0], dict(op.kwargs)["extra_key"]
        n, key_tokens = insert_span(tokens, side.tree.page_size, side.eagle)
        slots = side.alloc.alloc(n)
        if slots is None:
            return None
        cached = side.tree.insert(side.key(key_tokens, extra), slots, prev_prefix_len=0)
        return [slots, cached]

    def snapshot(self, side: RadixSide) -> RadixSnapshot:
        return RadixSnapshot(side.alloc.snapshot(), coarse_tree(side.tree.snapshot()))


__all__ = ["UnifiedRadixTarget", "coarse_tree"]

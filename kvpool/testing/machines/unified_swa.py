"""The unified SWA radix-cache machine: SGLang's ``UnifiedRadixCache`` with the FULL and SWA
components (0.5.23's, or 0.5.16's earlier design: the ``Rules.unified_*`` knobs), over its SWA
allocator, against kvpool's model of it.

The operations, draws and invariants are the SWA radix machine's
(:class:`~kvpool.testing.machines.swa_radix.SWARadixTarget`: inserts of finished requests whose
first tokens left the window, locks, early SWA releases, unlocks, full and SWA evictions) plus
an eviction policy per run (0.5.23's full eviction follows it). A side is built from the
implementation's ``swa_allocator`` and ``unified_swa_radix_cache`` factories.

Trees are compared by :func:`coarse_swa_tree`: nodes, keys, values, full locks, tombstones,
parents, children in id order and the four sizes, without access times, hit counts and
priorities (SGLang's Rust core exposes none; an order they decide shows in which slots an
eviction frees, which the allocator snapshot compares). Per-node SWA lock counts are compared
when both sides report them (``swa_lock_counts_readable``: SGLang's Rust core does not), else
only through the SWA sizes.

The invariants are the SWA radix machine's, with one rule of 0.5.23: a window lock counts every
node of its segment, tombstones included (0.5.16's ``SWARadixCache`` refused to lock over a
tombstone, its ``UnifiedRadixCache`` skips them: ``Rules.unified_tombstone_lock``), so under
``"count"`` ``INV-SWA-TREE-LOCKS``' "no SWA lock on a tombstone" clause is checked without the
tombstones' SWA counts (under ``"skip"`` with them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvpool.config import PoolConfig
from kvpool.invariants import check_swa_allocator
from kvpool.snapshot import TreeSnapshot
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.radix import eagle_pages
from kvpool.testing.machines.swa_radix import PAGE_SIZES, Snap, SWARadixTarget, TreeModel, TreeSide
from kvpool.testing.machines.unified import coarse_tree
from kvpool.testing.swarm import Chooser, Op

POLICIES = ("lru", "lru", "lfu", "fifo", "mru", "filo", "priority")
"""Eviction policies a run draws (LRU, SGLang's default, twice as often)."""


def coarse_swa_tree(tree: TreeSnapshot, swa_locks: bool = True) -> TreeSnapshot:
    """``tree`` as this machine compares it (module docstring); ``swa_locks`` False drops the
    per-node SWA lock counts but the root's."""
    tree = coarse_tree(tree)
    if swa_locks:
        return tree
    root = tree.nodes[0].node_id if tree.nodes else None
    nodes = tuple(n if n.node_id == root else dataclasses.replace(n, swa_lock_ref=0)
                  for n in tree.nodes)  # fmt: skip
    return dataclasses.replace(tree, nodes=nodes)


class UnifiedSWARadixTarget(SWARadixTarget):
    """:class:`~kvpool.testing.machines.base.Target` of the unified SWA radix cache."""

    name = "unified_swa_radix_cache"

    def __init__(self) -> None:
        self._swa_locks = True
        """Whether every side built since the last :meth:`new_model` reports per-node SWA
        lock counts (a pair builds its sides right after its model; the first snapshot, of
        an empty tree, holds only the root, which every side reports)."""

    page_sizes: tuple[int, ...] = (*PAGE_SIZES, 16)
    """Page sizes a run draws (a test may narrow them)."""

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        """The SWA radix machine's draw over :attr:`page_sizes`, with an eviction policy."""
        ps = c.choice(self.page_sizes)
        window = c.choice((1, ps, ps + 1, 2 * ps, 3 * ps + 1))
        pages = c.integer(12, 40)
        return PoolConfig(size=pages * ps, page_size=ps, sliding_window=window,
                          swa_full_tokens_ratio=c.choice((0.5, 0.8, 1.0)),
                          need_sort=c.choice((False, True)), eviction_policy=c.choice(POLICIES),
                          rules=impl.rules_or_default(),
                          is_eagle=eagle_pages(impl, pages))  # fmt: skip

    def new_model(self, config: PoolConfig) -> TreeModel:
        self._swa_locks = True
        return super().new_model(config)

    def build(self, impl: Implementation, config: PoolConfig) -> TreeSide:
        assert impl.swa_allocator and impl.unified_swa_radix_cache and impl.radix_key
        alloc = impl.swa_allocator(config)
        tree = impl.unified_swa_radix_cache(config, alloc)
        if not getattr(tree, "swa_lock_counts_readable", True):
            self._swa_locks = False
        return TreeSide(alloc, tree, impl.index, impl.radix_key, eagle=config.is_eagle)

    def snapshot(self, side: TreeSide) -> Snap:
        return side.alloc.snapshot(), coarse_swa_tree(side.tree.snapshot(), self._swa_locks)

    def coverage(self, model: TreeModel, op: Op, out: Outcome) -> list[str]:
        """The SWA radix machine's tags, plus 0.5.23's tombstone leaves: an insert that keeps
        a new tail without window KV, a full eviction that deletes a tombstone leaf."""
        tags = super().coverage(model, op, out)
        if out.error is not None or op.expect_error or out.result is None:
            return tags
        before, after = out.before[1], out.after[1]
        leaves = {n.node_id for n in after.nodes if n.swa_tombstone and not n.child_ids}
        if op.name == "insert_new" and leaves - {n.node_id for n in before.nodes}:
            tags.append("insert:tombstone-leaf")
        gone = {n.node_id for n in before.nodes} - {n.node_id for n in after.nodes}
        dead = {n.node_id for n in before.nodes if n.swa_tombstone and not n.child_ids}
        if op.name == "evict" and gone & dead:
            tags.append("evict:tombstone-leaf")
        return tags

    def check(self, model: TreeModel, snap: Any, previous: Any) -> int:
        alloc_snap, tree = snap
        ps = tree.page_size
        pages = {s // ps for n in tree.nodes for s in n.value}
        swa_held = tree.swa_evictable_size + tree.swa_protected_size
        checked = tree
        if model.config.rules.unified_tombstone_lock == "count":
            # 0.5.23 counts a window lock on the tombstones of its segment (module docstring)
            nodes = tuple(dataclasses.replace(n, swa_lock_ref=0) if n.swa_tombstone else n
                          for n in tree.nodes)  # fmt: skip
            checked = dataclasses.replace(tree, nodes=nodes)
        if not self._swa_locks:
            # no per-node SWA locks to split the SWA sizes by: their total is checked (and
            # the split compared with the other side's)
            checked = dataclasses.replace(checked, swa_evictable_size=swa_held,
                                          swa_protected_size=0)  # fmt: skip
        return check_swa_allocator(alloc_snap, pages, swa_held, checked)


__all__ = ["POLICIES", "UnifiedSWARadixTarget", "coarse_swa_tree"]

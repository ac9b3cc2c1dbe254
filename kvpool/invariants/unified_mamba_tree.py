"""Invariants of SGLang 0.5.23's FULL + MAMBA unified tree (scope ``"unified_mamba_tree"``).

The same snapshot as the Mamba radix cache's (:class:`~kvpool.snapshot.MambaTreeSnapshot`;
``full_*`` sizes in tokens, ``mamba_*`` in states), under 0.5.23's rules, which differ from
:mod:`kvpool.invariants.mamba_tree`'s in two places: a leaf may be a tombstone (a node whose
state was evicted keeps its KV, also at the bottom of the tree), and a tombstone may carry a
state lock (the Mamba lock counts its anchor node whether or not it holds a state). An LRU order
is checked only where the snapshot reports one (SGLang's Rust core exposes none, its Python core
no KV order: the unified tree evicts KV by its policy's heap).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from kvpool.errors import InvariantViolation
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import INVARIANTS, invariant, run_scope
from kvpool.snapshot import MambaTreeSnapshot, PoolSnapshot


@invariant(
    "INV-UMAMBA-TREE-SHAPE",
    "parent and child links agree, every non-root node holds KV for its whole key, and each "
    "reported LRU order lists its nodes (every non-root node, every node with a state) once",
    scope="unified_mamba_tree",
)
def check_unified_shape(tree: MambaTreeSnapshot) -> None:
    by_id = {n.node_id: n for n in tree.nodes}
    fail("INV-UMAMBA-TREE-SHAPE", "children whose parent link points elsewhere",
         [c for n in tree.nodes for c in n.child_ids
          if c not in by_id or by_id[c].parent_id != n.node_id])  # fmt: skip
    fail("INV-UMAMBA-TREE-SHAPE", "non-root nodes without a key or whose KV and key differ",
         [n.node_id for n in tree.nodes[1:]
          if not n.key or len(n.key) != len(n.value)])  # fmt: skip
    non_root = [n.node_id for n in tree.nodes[1:]]
    with_state = [n.node_id for n in tree.nodes[1:] if n.mamba_value is not None]
    for order, expected, what in ((tree.full_lru, non_root, "KV"),
                                  (tree.mamba_lru, with_state, "state")):  # fmt: skip
        if not order:
            continue  # not reported
        listed = set(order)
        if len(listed) == len(order) and listed == set(expected):
            continue  # each node once, and exactly the expected ones (decided in C)
        counts = Counter(order)
        fail("INV-UMAMBA-TREE-SHAPE", f"nodes listed twice in the {what} LRU order",
             [i for i, k in counts.items() if k > 1])  # fmt: skip
        fail("INV-UMAMBA-TREE-SHAPE", f"nodes missing from or stray in the {what} LRU order",
             set(counts) ^ set(expected))  # fmt: skip


@invariant(
    "INV-UMAMBA-TREE-LOCKS",
    "full_lock_ref >= mamba_lock_ref >= 0 (a tombstone may hold a state lock), a parent's KV "
    "lock covers its children's, and the evictable and protected sizes match the locks",
    scope="unified_mamba_tree",
)
def check_unified_locks(tree: MambaTreeSnapshot) -> None:
    if not tree.nodes:
        return
    by_id = {n.node_id: n for n in tree.nodes}
    rest = tree.nodes[1:]
    fail("INV-UMAMBA-TREE-LOCKS", "nodes whose state lock exceeds their KV lock (or is < 0)",
         [n.node_id for n in rest if not n.full_lock_ref >= n.mamba_lock_ref >= 0])  # fmt: skip
    fail("INV-UMAMBA-TREE-LOCKS", "nodes whose KV lock is below their children's",
         [n.node_id for n in rest
          if n.full_lock_ref < sum(by_id[c].full_lock_ref for c in n.child_ids)])  # fmt: skip
    sizes = (
        sum(len(n.value) for n in rest if n.full_lock_ref == 0),
        sum(1 for n in rest if n.mamba_value is not None and n.mamba_lock_ref == 0),
        sum(len(n.value) for n in rest if n.full_lock_ref > 0),
        sum(1 for n in rest if n.mamba_value is not None and n.mamba_lock_ref > 0),
    )
    kept = (tree.full_evictable_size, tree.mamba_evictable_size, tree.full_protected_size,
            tree.mamba_protected_size)  # fmt: skip
    if sizes != kept:
        raise InvariantViolation(
            "INV-UMAMBA-TREE-LOCKS",
            f"sizes (full evictable, mamba evictable, full protected, mamba protected) are "
            f"{kept}, the locks say {sizes}",
        )


def _pool_scope(check: Callable[[MambaTreeSnapshot], None]) -> Callable[
    [PoolSnapshot, PoolSnapshot | None], None
]:  # fmt: skip
    """``check`` at pool scope: on a hybrid manager's unified FULL+MAMBA tree
    (``MambaTreeSnapshot.unified``; SGLang 0.5.23's rules, ``Rules.mamba_tree``)."""

    def run(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
        tree = None if snap.mamba is None else snap.mamba.tree
        if tree is not None and tree.unified:
            check(tree)

    return run


for _id, _check in (
    ("INV-UMAMBA-TREE-SHAPE", check_unified_shape),
    ("INV-UMAMBA-TREE-LOCKS", check_unified_locks),
):
    invariant(_id, INVARIANTS[_id].description, scope="pool")(_pool_scope(_check))


def check_unified_mamba_tree(tree: MambaTreeSnapshot) -> int:
    """Every ``"unified_mamba_tree"`` invariant on ``tree``; returns the number of checks run."""
    return run_scope("unified_mamba_tree", tree)


__all__ = ["check_unified_mamba_tree"]

"""Invariants of a Mamba radix cache (scope ``"mamba_tree"``): shape, locks, sizes, LRU orders.

Units: ``full_*`` sizes are tokens, ``mamba_*`` sizes are states (slots). A check gets a
:class:`~kvpool.snapshot.MambaTreeSnapshot` only; the slot accounting across the tree, the
requests and the free lists is :mod:`kvpool.invariants.mamba`'s (the tree's states are its
checkpoints).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from kvpool.errors import InvariantViolation
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import INVARIANTS, invariant, run_scope
from kvpool.snapshot import MambaTreeSnapshot, PoolSnapshot


@invariant(
    "INV-MAMBA-TREE-SHAPE",
    "parent and child links agree, no leaf is a tombstone (a node without a state), and the KV "
    "LRU order lists every non-root node once, the state order every node with a state once",
    scope="mamba_tree",
)
def check_tree_shape(tree: MambaTreeSnapshot) -> None:
    by_id = {n.node_id: n for n in tree.nodes}
    root = tree.nodes[0] if tree.nodes else None
    fail("INV-MAMBA-TREE-SHAPE", "children whose parent link points elsewhere",
         [c for n in tree.nodes for c in n.child_ids
          if c not in by_id or by_id[c].parent_id != n.node_id])  # fmt: skip
    tombstone_leaves = [n.node_id for n in tree.nodes[1:]
                        if not n.child_ids and n.mamba_value is None]  # fmt: skip
    fail("INV-MAMBA-TREE-SHAPE", "leaves without a state (tombstone leaves)", tombstone_leaves)
    fail("INV-MAMBA-TREE-SHAPE", "nodes whose KV and key lengths differ",
         [n.node_id for n in tree.nodes if len(n.key) != len(n.value)])  # fmt: skip
    non_root = [n.node_id for n in tree.nodes if n is not root]
    with_state = [n.node_id for n in tree.nodes if n is not root and n.mamba_value is not None]
    for order, expected, what in ((tree.full_lru, non_root, "KV"),
                                  (tree.mamba_lru, with_state, "state")):  # fmt: skip
        listed = set(order)
        if len(listed) == len(order) and listed == set(expected):
            continue  # each node once, and exactly the expected ones (decided in C)
        counts = Counter(order)
        fail("INV-MAMBA-TREE-SHAPE", f"nodes listed twice in the {what} LRU order",
             [i for i, k in counts.items() if k > 1])  # fmt: skip
        fail("INV-MAMBA-TREE-SHAPE", f"nodes missing from or stray in the {what} LRU order",
             set(counts) ^ set(expected))  # fmt: skip


@invariant(
    "INV-MAMBA-TREE-LOCKS",
    "full_lock_ref >= mamba_lock_ref >= 0, a tombstone has no state lock, a parent's KV lock "
    "covers its children's, and the evictable and protected sizes match the locks",
    scope="mamba_tree",
)
def check_tree_locks(tree: MambaTreeSnapshot) -> None:
    if not tree.nodes:
        return
    by_id = {n.node_id: n for n in tree.nodes}
    rest = tree.nodes[1:]
    fail("INV-MAMBA-TREE-LOCKS", "nodes whose state lock exceeds their KV lock (or is < 0)",
         [n.node_id for n in rest if not n.full_lock_ref >= n.mamba_lock_ref >= 0])  # fmt: skip
    fail("INV-MAMBA-TREE-LOCKS", "tombstones with a state lock",
         [n.node_id for n in rest if n.mamba_value is None and n.mamba_lock_ref])  # fmt: skip
    fail("INV-MAMBA-TREE-LOCKS", "nodes whose KV lock is below their children's",
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
            "INV-MAMBA-TREE-LOCKS",
            f"sizes (full evictable, mamba evictable, full protected, mamba protected) are "
            f"{kept}, the locks say {sizes}",
        )


def _pool_scope(check: Callable[[MambaTreeSnapshot], None]) -> Callable[
    [PoolSnapshot, PoolSnapshot | None], None
]:  # fmt: skip
    """``check`` at pool scope: on the Mamba radix cache of a hybrid manager's snapshot
    (SGLang 0.5.23's unified tree has its own: :mod:`kvpool.invariants.unified_mamba_tree`)."""

    def run(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
        tree = None if snap.mamba is None else snap.mamba.tree
        if tree is not None and not tree.unified:
            check(tree)

    return run


for _id, _check in (
    ("INV-MAMBA-TREE-SHAPE", check_tree_shape),
    ("INV-MAMBA-TREE-LOCKS", check_tree_locks),
):
    invariant(_id, INVARIANTS[_id].description, scope="pool")(_pool_scope(_check))


def check_mamba_tree(tree: MambaTreeSnapshot) -> int:
    """Every ``"mamba_tree"`` invariant on ``tree``; returns the number of checks run."""
    return run_scope("mamba_tree", tree)


__all__ = ["check_mamba_tree"]

"""The ``unified_mamba_tree`` invariants (SGLang 0.5.23's FULL + MAMBA tree): what 0.5.16's rules
refuse and 0.5.23 allows (a tombstone leaf, a lock on a tombstone) passes, broken links, lengths,
LRU orders and sizes fail with their ids."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.errors import InvariantViolation
from kvpool.invariants import INVARIANTS
from kvpool.invariants.mamba_tree import check_mamba_tree
from kvpool.invariants.unified_mamba_tree import check_unified_mamba_tree
from kvpool.snapshot import MambaNodeSnapshot, MambaTreeSnapshot


def _tree() -> MambaTreeSnapshot:
    """Root -> [1 2] (a tombstone leaf, locked) and [3] (state 1)."""
    root = MambaNodeSnapshot(0, None, (), None, (), None, 1, 1, (1, 2))
    tomb = MambaNodeSnapshot(1, 0, (1, 2), None, (5, 6), None, 1, 1)
    leaf = MambaNodeSnapshot(2, 0, (3,), None, (7,), 1, 0, 0)
    return MambaTreeSnapshot(1, 1, 2, 0, (root, tomb, leaf), full_lru=(2, 1), mamba_lru=(2,))


def test_tombstone_leaves_and_locks_pass_here_not_under_0_5_16() -> None:
    assert check_unified_mamba_tree(_tree()) == 2
    with pytest.raises(InvariantViolation):
        check_mamba_tree(_tree())
    # at pool scope too, on a hybrid manager's tree marked unified (Rules.mamba_tree)
    assert set(INVARIANTS["INV-UMAMBA-TREE-SHAPE"].scopes) == {"unified_mamba_tree", "pool"}


@pytest.mark.parametrize(
    ("change", "inv_id"),
    [
        ({"full_evictable_size": 0}, "INV-UMAMBA-TREE-LOCKS"),
        ({"mamba_lru": (2, 2)}, "INV-UMAMBA-TREE-SHAPE"),
        ({"full_lru": (1,)}, "INV-UMAMBA-TREE-SHAPE"),
    ],
)
def test_broken_trees_fail(change: dict[str, object], inv_id: str) -> None:
    with pytest.raises(InvariantViolation) as got:
        check_unified_mamba_tree(dataclasses.replace(_tree(), **change))  # type: ignore[arg-type]
    assert got.value.invariant_id == inv_id


def test_a_state_lock_above_the_kv_lock_fails() -> None:
    tree = _tree()
    nodes = list(tree.nodes)
    nodes[2] = dataclasses.replace(nodes[2], mamba_lock_ref=1)
    with pytest.raises(InvariantViolation, match="state lock exceeds"):
        check_unified_mamba_tree(dataclasses.replace(tree, nodes=tuple(nodes)))


def test_unreported_lru_orders_are_not_checked() -> None:
    assert check_unified_mamba_tree(dataclasses.replace(_tree(), full_lru=(), mamba_lru=())) == 2

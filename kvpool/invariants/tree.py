"""Radix-tree invariants over a :class:`~kvpool.snapshot.PoolSnapshot` (scope ``"pool"``).

Units: key/value lengths and sizes are tokens; values are token slots; pages are slot //
page_size. A disabled tree (chunk cache) has no nodes and zero sizes, so these checks then only
require that.

Lock holders are the requests and sessions that name a ``last_node_id`` (with the host tier,
also the transfers in flight that hold a lock: :func:`lock_holders`); a non-root node's
``lock_ref`` must equal the number of holders whose last node lies in its subtree (this catches a
lock walked from the wrong node, lost on a split, or never released). With the host tier the
pool invariants read the tree without its host-only nodes (:func:`device_view`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import chain

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import InvariantViolation
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import invariant
from kvpool.snapshot import NodeSnapshot, PoolSnapshot, TreeSnapshot


def nodes_by_id(tree: TreeSnapshot) -> dict[int, NodeSnapshot]:
    """Node id -> node."""
    return {n.node_id: n for n in tree.nodes}


def path_values(tree: TreeSnapshot, node_id: int) -> list[int] | None:
    """Slots of the root -> ``node_id`` path (concatenated values), None if the id is unknown."""
    by_id = nodes_by_id(tree)
    parts: list[tuple[int, ...]] = []
    cur = by_id.get(node_id)
    if cur is None:
        return None
    while cur is not None and cur.parent_id is not None:
        parts.append(cur.value)
        cur = by_id.get(cur.parent_id)
    out: list[int] = []
    for part in reversed(parts):
        out.extend(part)
    return out


def tree_pages(tree: TreeSnapshot) -> Counter[int]:
    """How many nodes name each page (slot // page_size, counted once per node)."""
    counts: Counter[int] = Counter()
    for node in tree.nodes:
        counts.update({slot // tree.page_size for slot in node.value})
    return counts


def lock_holders(snap: PoolSnapshot) -> list[int]:
    """``last_node_id`` of every request and session that names one (one entry per holder);
    with the host tier, also the node of every load in flight and (write-through) of every
    write in flight: each holds a lock until its acknowledgement."""
    held = [r.last_node_id for r in snap.reqs if r.last_node_id is not None]
    held += [s.last_node_id for s in snap.sessions if s.last_node_id is not None]
    if snap.host is not None:
        held += [
            i
            for t in snap.host.transfers
            for i in t.node_ids
            if t.kind == "load" or snap.host.write_policy != "write_back"
        ]
    return held


def device_view(tree: TreeSnapshot) -> TreeSnapshot:
    """The tree without its host-only (``evicted``) nodes, which hold no device slots; they
    form whole subtrees below on-device nodes, so what is left is a radix tree over device
    slots."""
    keep = {n.node_id for n in tree.nodes if not n.evicted}
    nodes = []
    for n in tree.nodes:
        if n.node_id not in keep:
            continue
        kids = [(c, k) for c, k in zip(n.child_ids, n.child_keys, strict=False) if c in keep]
        nodes.append(
            replace(
                n,
                child_ids=tuple(c for c, _ in kids),
                child_keys=tuple(k for _, k in kids),
            )
        )
    return replace(tree, nodes=tuple(nodes))


@invariant(
    "INV-TREE-SHAPE",
    "parent/child links agree; children keyed by the first token/page of the child's key; "
    "len(value) == len(key); keys page-aligned and non-empty; values page-contiguous; no slot in "
    "two nodes; every tree slot allocated; extra_key equal along a path",
    scope="pool",
)
def check_tree_shape(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    tree, ps = snap.tree, snap.tree.page_size
    if tree.disabled or not tree.nodes:
        fail("INV-TREE-SHAPE", "a disabled tree lists nodes", [n.node_id for n in tree.nodes])
        if tree.evictable_size or tree.protected_size:
            raise InvariantViolation("INV-TREE-SHAPE", "a disabled tree has non-zero sizes")
        return
    by_id = nodes_by_id(tree)
    root = tree.nodes[0]
    if root.parent_id is not None or root.key or root.value:
        raise InvariantViolation("INV-TREE-SHAPE", "nodes[0] is not an empty root", [root.node_id])
    bad: list[int] = []
    for node in tree.nodes:
        if len(node.child_ids) != len(node.child_keys):
            bad.append(node.node_id)
        seen: set[tuple[str | None, tuple[int, ...]]] = set()
        for cid, ckey in zip(node.child_ids, node.child_keys, strict=False):
            child = by_id.get(cid)
            if child is None or child.parent_id != node.node_id:
                bad.append(cid)
                continue
            if ckey != child.key[:ps] or (child.extra_key, ckey) in seen:
                bad.append(cid)
            seen.add((child.extra_key, ckey))
        if node is root:
            continue
        parent = by_id.get(node.parent_id if node.parent_id is not None else -1)
        linked = parent is not None and node.node_id in parent.child_ids
        namespace_ok = parent is None or parent is root or parent.extra_key == node.extra_key
        if not linked or not namespace_ok:
            bad.append(node.node_id)
        if not node.key or len(node.key) % ps or len(node.value) != len(node.key):
            bad.append(node.node_id)
        # (at page size 1 every value is trivially page-contiguous: no scan)
        for k in range(0, len(node.value) - ps + 1, ps) if ps > 1 else ():
            first = node.value[k]
            if first % ps or tuple(node.value[k : k + ps]) != tuple(range(first, first + ps)):
                bad.append(node.node_id)
    fail("INV-TREE-SHAPE", "malformed nodes", bad)
    if len(by_id) != len(tree.nodes):
        raise InvariantViolation("INV-TREE-SHAPE", "node ids repeat")
    slots = Counter(chain.from_iterable(n.value for n in tree.nodes))
    if len(slots) < sum(len(n.value) for n in tree.nodes):  # a repeat: name the slots
        fail("INV-TREE-SHAPE", "slots in two nodes", [s for s, c in slots.items() if c > 1])
    alloc = snap.allocator
    free = set(alloc.free_pages) | set(alloc.release_pages)
    free |= {s // alloc.page_size for s in alloc.pending_free}
    fail(
        "INV-TREE-SHAPE",
        "tree slots not allocated (free, pending or out of range)",
        [s for s in slots if s // ps in free or not RESERVED_INDEX < s // ps <= alloc.num_pages],
    )


@invariant(
    "INV-LOCKS",
    "lock_ref >= 0; root == 1; parent >= child; each lock_ref == holders in its subtree; "
    "evictable/protected sizes equal their sums over the tree; every holder's last node is in "
    "the tree and locked; a node locked in the previous snapshot was not evicted",
    scope="pool",
)
def check_locks(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    tree = snap.tree
    if tree.disabled:
        fail("INV-LOCKS", "holders name nodes of a disabled tree", lock_holders(snap))
        return
    by_id = nodes_by_id(tree)
    root = tree.nodes[0]
    if root.lock_ref != 1:
        raise InvariantViolation("INV-LOCKS", f"root lock_ref {root.lock_ref} != 1", [0])
    fail("INV-LOCKS", "negative lock_ref", [n.node_id for n in tree.nodes if n.lock_ref < 0])
    fail(
        "INV-LOCKS",
        "child locked more than its parent",
        [
            n.node_id
            for n in tree.nodes
            if n.parent_id is not None
            and n.parent_id != root.node_id
            and n.parent_id in by_id
            and by_id[n.parent_id].lock_ref < n.lock_ref
        ],
    )
    holders = lock_holders(snap)
    fail("INV-LOCKS", "holders name nodes not in the tree", [h for h in holders if h not in by_id])
    expected: Counter[int] = Counter()
    for h in holders:
        cur = by_id.get(h)
        while cur is not None and cur.parent_id is not None:
            expected[cur.node_id] += 1
            cur = by_id.get(cur.parent_id)
    fail(
        "INV-LOCKS",
        "lock_ref differs from the number of holders below (leaked or lost lock)",
        [n.node_id for n in tree.nodes[1:] if n.lock_ref != expected[n.node_id]],
    )
    evictable = sum(len(n.key) for n in tree.nodes[1:] if n.lock_ref == 0)
    protected = sum(len(n.key) for n in tree.nodes[1:] if n.lock_ref > 0)
    if (evictable, protected) != (tree.evictable_size, tree.protected_size):
        raise InvariantViolation(
            "INV-LOCKS",
            f"sizes (evictable {tree.evictable_size}, protected {tree.protected_size}) != sums "
            f"over the tree ({evictable}, {protected})",
        )
    if previous is not None and not previous.tree.disabled:
        fail(
            "INV-LOCKS",
            "nodes locked in the previous snapshot were evicted",
            [n.node_id for n in previous.tree.nodes if n.lock_ref > 0 and n.node_id not in by_id],
        )


__all__ = ["device_view", "lock_holders", "nodes_by_id", "path_values", "tree_pages"]

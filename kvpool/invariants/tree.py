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
from itertools import chain

import kvpool.invariants.derived as derived
from kvpool.constants import RESERVED_INDEX
from kvpool.errors import InvariantViolation
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import invariant
from kvpool.records import replaced
from kvpool.snapshot import NodeSnapshot, PoolSnapshot, TreeSnapshot


def nodes_by_id(tree: TreeSnapshot) -> dict[int, NodeSnapshot]:
    """Node id -> node (built once per tree snapshot and shared: read-only)."""
    return derived.by_id(tree)


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
    ps = tree.page_size
    counts: Counter[int] = Counter()
    if ps == 1:  # a slot is its own page: count each node's distinct slots in C
        counts.update(chain.from_iterable(map(set, (n.value for n in tree.nodes))))
        return counts
    for node in tree.nodes:
        counts.update(set(derived.page_of(node.value, ps)))
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
    slots. A tree whose nodes all stay unchanged is its own view (returned as is)."""
    return _device_view(tree)


def _build_device_view(tree: TreeSnapshot) -> TreeSnapshot:
    keep = {n.node_id for n in tree.nodes if not n.evicted}
    nodes = []
    changed = False  # (no node dropped or rebuilt: the tree is its own view)
    # A node object listed twice is rebuilt, as every node once was: the shape check tells
    # the root from other nodes by identity.
    reuse = len(set(map(id, tree.nodes))) == len(tree.nodes)
    for n in tree.nodes:
        if n.node_id not in keep:
            changed = True
            continue
        if reuse and len(n.child_ids) == len(n.child_keys) and keep.issuperset(n.child_ids):
            # no child dropped (and nothing for zip to cut): the node as it is
            nodes.append(n)
            continue
        changed = True
        kids = [(c, k) for c, k in zip(n.child_ids, n.child_keys, strict=False) if c in keep]
        nodes.append(
            replaced(
                n,
                child_ids=tuple(c for c, _ in kids),
                child_keys=tuple(k for _, k in kids),
            )
        )
    return replaced(tree, nodes=tuple(nodes)) if changed else tree


_device_view: derived.IdentityMemo[TreeSnapshot, TreeSnapshot] = derived.identity_memo(
    _build_device_view
)


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
        if tree.nodes:
            fail("INV-TREE-SHAPE", "a disabled tree lists nodes", [n.node_id for n in tree.nodes])
        if tree.evictable_size or tree.protected_size:
            raise InvariantViolation("INV-TREE-SHAPE", "a disabled tree has non-zero sizes")
        return
    by_id = derived.by_id(tree)
    get = by_id.get
    root = tree.nodes[0]
    if root.parent_id is not None or root.key or root.value:
        raise InvariantViolation("INV-TREE-SHAPE", "nodes[0] is not an empty root", [root.node_id])
    bad: list[int] = []
    # every node's slots (the root has none) and, at a page size above 1, each value's first
    # slot of every page, gathered in the same pass for the checks after it
    every: list[int] = []
    firsts: list[int] = []
    for node in tree.nodes:
        nid, cids, ckeys = node.node_id, node.child_ids, node.child_keys
        if len(cids) != len(ckeys):
            bad.append(nid)
        if cids:  # (a leaf has no child link to check)
            seen: set[tuple[str | None, tuple[int, ...]]] = set()
            for cid, ckey in zip(cids, ckeys, strict=False):
                child = get(cid)
                if child is None or child.parent_id != nid:
                    bad.append(cid)
                    continue
                named = (child.extra_key, ckey)
                if ckey != child.key[:ps] or named in seen:
                    bad.append(cid)
                seen.add(named)
        if node is root:
            continue
        pid = node.parent_id
        parent = get(pid if pid is not None else -1)
        if (
            parent is None
            or nid not in parent.child_ids
            or (parent is not root and parent.extra_key != node.extra_key)
        ):
            bad.append(nid)
        key, value = node.key, node.value
        every += value
        if not key or len(key) % ps or len(value) != len(key):
            bad.append(nid)
        # (at page size 1 every value is trivially page-contiguous, and a page-contiguous
        # value, decided in C, has no offending page: no scan)
        if ps <= 1:
            continue
        firsts += value[::ps]
        if derived.page_contiguous(value, ps):
            continue
        for k in range(0, len(value) - ps + 1, ps):
            first = value[k]
            if first % ps or tuple(value[k : k + ps]) != tuple(range(first, first + ps)):
                bad.append(nid)
    if bad:
        fail("INV-TREE-SHAPE", "malformed nodes", bad)
    if len(by_id) != len(tree.nodes):
        raise InvariantViolation("INV-TREE-SHAPE", "node ids repeat")
    distinct = set(every)
    if len(distinct) < len(every):  # a repeat: name the slots
        fail(
            "INV-TREE-SHAPE", "slots in two nodes", [s for s, c in Counter(every).items() if c > 1]
        )
    alloc = snap.allocator
    free = derived.free_pages(alloc)
    # Every value is whole pages here (the malformed-node check passed), so a value's first
    # slot of each page names all its pages; the per-slot scan below only names offenders.
    pages: set[int] | None = None  # (None: a broken page size, the scan alone decides)
    if ps == 1:
        pages = distinct
    elif ps > 1:
        pages = set(derived.page_of(firsts, ps))
    if pages is None or (
        pages
        and (
            not free.isdisjoint(pages)
            or min(pages) <= RESERVED_INDEX
            or max(pages) > alloc.num_pages
        )
    ):
        fail(
            "INV-TREE-SHAPE",
            "tree slots not allocated (free, pending or out of range)",
            [
                s
                for s in distinct
                if s // ps in free or not RESERVED_INDEX < s // ps <= alloc.num_pages
            ],
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
    by_id = derived.by_id(tree)
    get = by_id.get
    root = tree.nodes[0]
    if root.lock_ref != 1:
        raise InvariantViolation("INV-LOCKS", f"root lock_ref {root.lock_ref} != 1", [0])
    # one pass over the nodes gathers what the checks below report, in their order
    negative: list[int] = []
    over_parent: list[int] = []
    evictable = protected = 0
    root_id = root.node_id
    # (nodes[0]: its lock_ref is 1, so not negative; a parent of it is still compared)
    pid = root.parent_id
    if pid is not None and pid != root_id:
        parent = get(pid)
        if parent is not None and parent.lock_ref < 1:
            over_parent.append(root_id)
    rest = tree.nodes[1:]
    for n in rest:
        lock = n.lock_ref
        if lock < 0:
            negative.append(n.node_id)
        pid = n.parent_id
        if pid is not None and pid != root_id:
            parent = get(pid)
            if parent is not None and parent.lock_ref < lock:
                over_parent.append(n.node_id)
        if lock == 0:
            evictable += len(n.key)
        elif lock > 0:
            protected += len(n.key)
    # (each fail only when its list names something: most steps name nothing)
    if negative:
        fail("INV-LOCKS", "negative lock_ref", negative)
    if over_parent:
        fail("INV-LOCKS", "child locked more than its parent", over_parent)
    holders = lock_holders(snap)
    if holders:
        missing = [h for h in holders if h not in by_id]
        if missing:
            fail("INV-LOCKS", "holders name nodes not in the tree", missing)
    expected: dict[int, int] = {}
    for h in holders:
        cur = get(h)
        while cur is not None and cur.parent_id is not None:
            expected[cur.node_id] = expected.get(cur.node_id, 0) + 1
            cur = get(cur.parent_id)
    wrong = [n.node_id for n in rest if n.lock_ref != expected.get(n.node_id, 0)]
    if wrong:
        fail(
            "INV-LOCKS",
            "lock_ref differs from the number of holders below (leaked or lost lock)",
            wrong,
        )
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

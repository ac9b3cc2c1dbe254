"""Read-only views of the optimized radix tree: the plain snapshot and a readable text dump.

Mirrors :mod:`kvpool.reference.radix.tree_view`: nodes breadth-first from the root, children in
their insertion order, the same fields and the same text, so both twins print and snapshot
identically.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kvpool.optimized.radix_key import TreeNode
from kvpool.records import fast_record, filled_record
from kvpool.reference.radix.tree_view import NO_HOST, HostFields
from kvpool.snapshot import NodeSnapshot, TreeSnapshot


class TreeViewHost(Protocol):
    """What the views read of a radix cache (sizes in tokens); nothing is written."""

    @property
    def page_size(self) -> int: ...
    @property
    def disable(self) -> bool: ...
    @property
    def eviction_policy(self) -> str: ...
    @property
    def root_node(self) -> TreeNode: ...
    @property
    def evictable_size_(self) -> int: ...
    @property
    def protected_size_(self) -> int: ...
    def total_size(self) -> int: ...


_TREE = fast_record(TreeSnapshot)
"""Builds a :class:`TreeSnapshot` (every field by keyword)."""


_PREVIEW = 8
"""Tokens/slots shown per node by :func:`pretty_print_tree` before eliding."""


def bfs_nodes(root: TreeNode) -> list[TreeNode]:
    """Every node, root first, breadth-first by child insertion order."""
    out = [root]
    i = 0
    while i < len(out):  # the list is its own queue: nodes are appended in visiting order
        out.extend(out[i].children.values())
        i += 1
    return out


def node_keys(order: list[TreeNode]) -> dict[int, tuple[int, ...]]:
    """Each node's tokens as a tuple of ints, by ``id`` of the node (valid while ``order``, a
    whole tree's :func:`bfs_nodes`, holds the nodes). Read once per node: a node's recorded
    child key is the first page of the child's own tuple, not a second read of its array."""
    return {id(node): tuple(node.arr.tolist()) for node in order}


def snapshot_tree(
    cache: TreeViewHost, host_fields: Callable[[TreeNode], HostFields] | None = None
) -> TreeSnapshot:
    """:class:`~kvpool.snapshot.TreeSnapshot` of ``cache``; a disabled cache lists no nodes.
    ``host_fields`` (a hierarchical cache's) gives each node's ``(evicted, host_value,
    host_ref_counter, write_pending)``; without it they keep their defaults."""
    nodes: list[NodeSnapshot] = []
    ps = cache.page_size
    if not cache.disable:
        order = bfs_nodes(cache.root_node)
        keys = node_keys(order)
        for node in order:
            children = node.children.values()
            host = NO_HOST if host_fields is None else host_fields(node)
            parent = node.parent
            nodes.append(
                filled_record(
                    NodeSnapshot,
                    {
                        "node_id": node.node_id,
                        "parent_id": None if parent is None else parent.node_id,
                        "key": keys[id(node)],
                        "extra_key": node.key.extra_key,
                        "value": tuple(node.value.tolist()),
                        "lock_ref": node.lock_ref,
                        "child_ids": tuple([c.node_id for c in children]),
                        # each child's key as recorded: its first page of tokens
                        "child_keys": tuple([keys[id(c)][:ps] for c in children]),
                        "last_access_time": float(node.last_access_time),
                        "hit_count": node.hit_count,
                        "priority": node.priority,
                        "swa_tombstone": False,
                        "swa_lock_ref": 0,
                        "evicted": host[0],
                        "host_value": host[1],
                        "host_ref_counter": host[2],
                        "write_pending": host[3],
                    },
                )
            )
    return _TREE(
        page_size=ps,
        disabled=cache.disable,
        eviction_policy=cache.eviction_policy,
        evictable_size=cache.evictable_size_,
        protected_size=cache.protected_size_,
        nodes=tuple(nodes),
        swa_evictable_size=0,
        swa_protected_size=0,
    )


def _preview(items: list[int]) -> str:
    shown = ",".join(str(x) for x in items[:_PREVIEW])
    return f"[{shown}{',...' if len(items) > _PREVIEW else ''}]({len(items)})"


def pretty_print_tree(cache: TreeViewHost) -> str:
    """One line per node, indented by depth: id, extra_key, key and value previews, lock_ref,
    last access time, hits; then a line with the sizes."""
    lines: list[str] = []
    stack: list[tuple[TreeNode, int]] = [(cache.root_node, 0)]
    if cache.disable:
        lines.append("(radix cache disabled)")
        stack = []
    while stack:  # explicit stack: deep trees must not hit the recursion limit
        node, depth = stack.pop()
        ns = f" ns={node.key.extra_key!r}" if node.key.extra_key is not None else ""
        lines.append(
            f"{'  ' * depth}#{node.node_id}{ns} key={_preview(node.arr.tolist())} "
            f"value={_preview(node.value.tolist())} lock={node.lock_ref} "
            f"t={node.last_access_time:g} hits={node.hit_count}"
        )
        stack.extend((c, depth + 1) for c in reversed(list(node.children.values())))
    lines.append(
        f"evictable={cache.evictable_size_} protected={cache.protected_size_} "
        f"total={cache.total_size()} policy={cache.eviction_policy} page_size={cache.page_size}"
    )
    return "\n".join(lines)


__all__ = [
    "TreeViewHost",
    "bfs_nodes",
    "node_keys",
    "pretty_print_tree",
    "snapshot_tree",
]

"""Read-only views of the optimized radix tree: the plain snapshot and a readable text dump.

Mirrors :mod:`kvpool.reference.radix.tree_view`: nodes breadth-first from the root, children in
their insertion order, the same fields and the same text, so both twins print and snapshot
identically.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from kvpool.optimized.radix_key import TreeNode
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


_PREVIEW = 8
"""Tokens/slots shown per node by :func:`pretty_print_tree` before eliding."""


def bfs_nodes(root: TreeNode) -> list[TreeNode]:
    """Every node, root first, breadth-first by child insertion order."""
    out: list[TreeNode] = []
    queue = deque([root])
    while queue:
        node = queue.popleft()
        out.append(node)
        queue.extend(node.children.values())
    return out


def snapshot_tree(cache: TreeViewHost) -> TreeSnapshot:
    """:class:`~kvpool.snapshot.TreeSnapshot` of ``cache``; a disabled cache lists no nodes."""
    nodes: list[NodeSnapshot] = []
    ps = cache.page_size
    if not cache.disable:
        for node in bfs_nodes(cache.root_node):
            children = list(node.children.values())
            nodes.append(
                NodeSnapshot(
                    node_id=node.node_id,
                    parent_id=None if node.parent is None else node.parent.node_id,
                    key=tuple(node.arr.tolist()),
                    extra_key=node.key.extra_key,
                    value=tuple(node.value.tolist()),
                    lock_ref=node.lock_ref,
                    child_ids=tuple([c.node_id for c in children]),
                    child_keys=tuple([tuple(c.arr[:ps].tolist()) for c in children]),
                    last_access_time=float(node.last_access_time),
                    hit_count=node.hit_count,
                    priority=node.priority,
                )
            )
    return TreeSnapshot(
        page_size=ps,
        disabled=cache.disable,
        eviction_policy=cache.eviction_policy,
        evictable_size=cache.evictable_size_,
        protected_size=cache.protected_size_,
        nodes=tuple(nodes),
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


__all__ = ["TreeViewHost", "bfs_nodes", "pretty_print_tree", "snapshot_tree"]

"""Read-only views of a radix tree: the plain snapshot and a readable text dump.

Node order everywhere is breadth-first from the root, children in their insertion order, so both
twins (and two runs of one twin) list nodes identically. :func:`stack_walk` gives the other order
a tree needs: the one in which SGLang drops a subtree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from kvpool.records import filled_record
from kvpool.reference.radix_key import TreeNode
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
    out = [root]
    for node in out:  # the list is its own queue: read in order while it grows at the end
        out.extend(node.children.values())
    return out


class Walkable(Protocol):
    """A tree node of either twin, as :func:`stack_walk` reads it."""

    @property
    def children(self) -> Mapping[Any, Any]: ...  # either twin's keys and nodes


N = TypeVar("N", bound=Walkable)


def stack_walk(top: N) -> list[N]:
    """Every node of ``top``'s subtree, ``top`` first, in the order a stack walk visits them:
    a node is popped, then its children are pushed in insertion order, so the last-inserted
    child is visited next (depth-first, children from the last). SGLang drops a subtree in this
    order, so it decides the order in which the subtree's slots go back. Both twins use this
    one walk (it reads only ``children``)."""
    out: list[N] = []
    stack = [top]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


HostFields = tuple[bool, tuple[int, ...] | None, int, bool]
"""A hierarchical cache node's ``(evicted, host_value, host_ref_counter, write_pending)``."""

NO_HOST: HostFields = (False, None, 0, False)
"""The host fields of a node of a cache without the host tier (the snapshot's defaults)."""


def snapshot_tree(
    cache: TreeViewHost, host_fields: Callable[[TreeNode], HostFields] | None = None
) -> TreeSnapshot:
    """:class:`~kvpool.snapshot.TreeSnapshot` of ``cache``; a disabled cache lists no nodes.
    ``host_fields`` (a hierarchical cache's) gives each node's ``(evicted, host_value,
    host_ref_counter, write_pending)``; without it they keep their defaults."""
    nodes: list[NodeSnapshot] = []
    if not cache.disable:
        ps = cache.page_size
        order = bfs_nodes(cache.root_node)
        # each node's tokens as a tuple once (by id: every node is held by ``order``); a
        # child's recorded key, its first page of tokens, is a slice of its own tuple
        keys = {id(node): tuple(node.key.token_ids) for node in order}
        for node in order:
            children = node.children.values()
            host = NO_HOST if host_fields is None else host_fields(node)
            parent = node.parent
            snap = filled_record(
                NodeSnapshot,
                {
                    "node_id": node.node_id,
                    "parent_id": None if parent is None else parent.node_id,
                    "key": keys[id(node)],
                    "extra_key": node.key.extra_key,
                    "value": tuple(node.value),
                    "lock_ref": node.lock_ref,
                    "child_ids": tuple([c.node_id for c in children]),
                    # each child's key as recorded: its first page of tokens, as a tuple
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
            nodes.append(snap)
    return filled_record(
        TreeSnapshot,
        {
            "page_size": cache.page_size,
            "disabled": cache.disable,
            "eviction_policy": cache.eviction_policy,
            "evictable_size": cache.evictable_size_,
            "protected_size": cache.protected_size_,
            "nodes": tuple(nodes),
            "swa_evictable_size": 0,
            "swa_protected_size": 0,
        },
    )


def _preview(items: list[int]) -> str:
    shown = ",".join(str(x) for x in items[:_PREVIEW])
    return f"[{shown}{',...' if len(items) > _PREVIEW else ''}]({len(items)})"


def pretty_print_tree(cache: TreeViewHost) -> str:
    """One line per node, indented by depth: id, extra_key, key and value previews, lock_ref,
    last access time, hits; then a line with the sizes."""
    lines: list[str] = []

    def walk(node: TreeNode, depth: int) -> None:
        ns = f" ns={node.key.extra_key!r}" if node.key.extra_key is not None else ""
        lines.append(
            f"{'  ' * depth}#{node.node_id}{ns} key={_preview(node.key.token_ids)} "
            f"value={_preview(node.value)} lock={node.lock_ref} "
            f"t={node.last_access_time:g} hits={node.hit_count}"
        )
        for child in node.children.values():
            walk(child, depth + 1)

    if cache.disable:
        lines.append("(radix cache disabled)")
    else:
        walk(cache.root_node, 0)
    lines.append(
        f"evictable={cache.evictable_size_} protected={cache.protected_size_} "
        f"total={cache.total_size()} policy={cache.eviction_policy} page_size={cache.page_size}"
    )
    return "\n".join(lines)


__all__ = [
    "NO_HOST",
    "HostFields",
    "TreeViewHost",
    "Walkable",
    "bfs_nodes",
    "pretty_print_tree",
    "snapshot_tree",
    "stack_walk",
]

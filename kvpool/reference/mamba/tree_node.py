"""The Mamba radix tree's vocabulary: ``MambaTreeNode`` and the two LRU orders (``LRUList``).

Units: a node's ``key`` and ``value`` are tokens and token slots (page size 1); its
``mamba_value`` is one Mamba slot (the state after the node's last token) or None (a
*tombstone*: the KV is cached, the state is not). ``full_lock_ref`` counts the requests whose
locked path runs through the node (a lock covers the whole path to the root);
``mamba_lock_ref`` counts those that use this node's state (a lock covers only the node), so
``full_lock_ref >= mamba_lock_ref`` always.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, Protocol, TypeVar

from kvpool.errors import InvalidArgumentError
from kvpool.host_checks import as_bool
from kvpool.reference.radix_key import ChildKey, RadixKey

_Node = TypeVar("_Node", bound="LRUNode")
"""The node class itself (a node's parent and children are of its own class)."""


class LRUNode(Protocol):
    """What an LRU order reads of a node (either twin's node class)."""

    node_id: int
    full_lock_ref: int
    mamba_lock_ref: int

    @property
    def mamba_value(self) -> object: ...

    @property
    def parent(self: _Node) -> _Node | None: ...

    @property
    def children(self: _Node) -> Mapping[ChildKey, _Node]: ...


N = TypeVar("N", bound=LRUNode)

_NODE_FIELDS = ("node_id", "parent", "children", "full_lock_ref", "mamba_lock_ref", "mamba_value")


def check_lru_node(name: str, node: object) -> None:
    """``node`` reads as a tree node (pure, both twins: an int ``node_id`` and the fields an
    LRU order reads); InvalidArgumentError naming ``name`` and the value otherwise."""
    if (
        any(not hasattr(node, f) for f in _NODE_FIELDS)
        or isinstance(getattr(node, "node_id", None), bool)
        or not isinstance(getattr(node, "node_id", None), int)
    ):
        raise InvalidArgumentError(f"{name} must be a Mamba tree node, got {node!r}")


def lru_path(node: N, root: N) -> list[N]:
    """``node`` and its ancestors below ``root``, nearest first (pure, both twins), after
    checking both are nodes and ``root`` is an ancestor of ``node`` (or ``node`` itself):
    InvalidArgumentError otherwise, before the caller changes anything."""
    check_lru_node("node", node)
    check_lru_node("root", root)
    path: list[N] = []
    cur: N | None = node
    while cur is not root:
        if cur is None:
            raise InvalidArgumentError(f"root {root!r} is not an ancestor of node {node!r}")
        path.append(cur)
        cur = cur.parent
    return path


class MambaTreeNode:
    """One node (see the module docstring); ``node_id`` from the owning cache's counter."""

    __slots__ = (
        "children",
        "full_lock_ref",
        "key",
        "mamba_lock_ref",
        "mamba_value",
        "node_id",
        "parent",
        "value",
    )

    def __init__(
        self,
        node_id: int,
        key: RadixKey,
        value: list[int],
        parent: MambaTreeNode | None,
        mamba_value: int | None = None,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.value = value
        self.parent = parent
        self.mamba_value = mamba_value
        self.children: dict[ChildKey, MambaTreeNode] = {}
        self.full_lock_ref = 0
        self.mamba_lock_ref = 0

    def __repr__(self) -> str:
        return (
            f"MambaTreeNode(id={self.node_id}, len={len(self.key)}, mamba={self.mamba_value}, "
            f"locks={self.full_lock_ref}/{self.mamba_lock_ref})"
        )


class LRUList(Generic[N]):
    """An LRU order of nodes, most recently used first (SGLang keeps a doubly linked list; a
    Python list gives the same order). ``mamba``: the order of cached states, whose lock is
    ``mamba_lock_ref``; else the order of KV, locked by ``full_lock_ref``."""

    def __init__(self, mamba: bool) -> None:
        self.mamba = mamba
        self.order: list[N] = []

    def _locked(self, node: N) -> bool:
        return (node.mamba_lock_ref if self.mamba else node.full_lock_ref) > 0

    def __contains__(self, node: N) -> bool:
        return any(n is node for n in self.order)

    def _check_member(self, node: N) -> None:
        check_lru_node("node", node)
        if node not in self:
            raise InvalidArgumentError(f"node {node.node_id} is not in the LRU list")

    def remove(self, node: N) -> None:
        """Take ``node`` out; InvalidArgumentError (nothing changed) for a node not in it."""
        self._check_member(node)
        self.order = [n for n in self.order if n is not node]

    def insert_mru(self, node: N) -> None:
        """Put ``node`` first (most recently used); InvalidArgumentError (nothing changed) for
        something that is not a node or a node already in the list."""
        check_lru_node("node", node)
        if node in self:
            raise InvalidArgumentError(f"node {node.node_id} already in the LRU list")
        self.order.insert(0, node)

    def reset_node_mru(self, node: N) -> None:
        """Move ``node`` (in the list: InvalidArgumentError otherwise) to the front."""
        self._check_member(node)
        self.order = [n for n in self.order if n is not node]
        self.order.insert(0, node)

    def reset_node_and_parents_mru(self, node: N, root: N) -> None:
        """Move ``node`` and its ancestors (root excluded) to the front, the node most recent
        and each ancestor just behind its child (in the mamba order only nodes with a state).
        InvalidArgumentError (nothing changed) when ``root`` is not an ancestor of ``node`` or
        a node of the path that belongs in this order is not in it."""
        path = [n for n in lru_path(node, root) if not self.mamba or n.mamba_value is not None]
        members = {id(n) for n in self.order}
        missing = [n.node_id for n in path if id(n) not in members]
        if missing:
            raise InvalidArgumentError(f"nodes {missing} of the path are not in the LRU list")
        ids = {id(n) for n in path}
        self.order = path + [n for n in self.order if id(n) not in ids]

    def lru_no_lock(self, leaf_only: bool = False) -> N | None:
        """The least recently used unlocked node (``leaf_only``: unlocked leaf), or None
        (``leaf_only`` a bool: InvalidArgumentError otherwise)."""
        as_bool("leaf_only", leaf_only)
        for node in reversed(self.order):
            if not self._locked(node) and not (leaf_only and node.children):
                return node
        return None

    def ids(self) -> tuple[int, ...]:
        return tuple(n.node_id for n in self.order)


__all__ = ["LRUList", "N", "check_lru_node", "lru_path"]

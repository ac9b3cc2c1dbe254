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

    def remove(self, node: N) -> None:
        self.order = [n for n in self.order if n is not node]

    def insert_mru(self, node: N) -> None:
        """Put ``node`` first (most recently used); it must not be in the list."""
        assert node not in self, f"node {node.node_id} already in the LRU list"
        self.order.insert(0, node)

    def reset_node_mru(self, node: N) -> None:
        """Move ``node`` (in the list) to the front."""
        self.remove(node)
        self.order.insert(0, node)

    def reset_node_and_parents_mru(self, node: N, root: N) -> None:
        """Move ``node`` and its ancestors (root excluded) to the front, the node most recent
        and each ancestor just behind its child (in the mamba order only nodes with a state)."""
        path: list[N] = []
        while node is not root:
            if not self.mamba or node.mamba_value is not None:
                path.append(node)
            assert node.parent is not None
            node = node.parent
        ids = {id(n) for n in path}
        self.order = path + [n for n in self.order if id(n) not in ids]

    def lru_no_lock(self, leaf_only: bool = False) -> N | None:
        """The least recently used unlocked node (``leaf_only``: unlocked leaf), or None."""
        for node in reversed(self.order):
            if not self._locked(node) and not (leaf_only and node.children):
                return node
        return None

    def ids(self) -> tuple[int, ...]:
        return tuple(n.node_id for n in self.order)


__all__ = ["LRUList", "N"]

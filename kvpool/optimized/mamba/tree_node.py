"""``MambaTreeNode`` (optimized twin): a Mamba radix-tree node whose KV value is a tensor.

Same fields and meaning as :mod:`kvpool.reference.mamba.tree_node`, but ``value`` is an int64
slot tensor on the device (the state slot stays a host int, as the twin's Mamba slots are). The
LRU orders are the reference's, kept in an insertion-ordered dict keyed by node id (most recently
used first), so that touching, inserting and removing a node is O(1) where the reference's list
is O(nodes), as SGLang's linked lists are.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic

import torch

from kvpool.errors import InvalidArgumentError
from kvpool.host_checks import as_bool
from kvpool.optimized.radix_key import RadixKey
from kvpool.reference.mamba.tree_node import N, check_lru_node, lru_path
from kvpool.reference.radix_key import ChildKey


class LRUList(Generic[N]):
    """The reference's LRU order (same methods, same orders) over an ordered dict."""

    def __init__(self, mamba: bool) -> None:
        self.mamba = mamba
        self._order: OrderedDict[int, N] = OrderedDict()

    def _locked(self, node: N) -> bool:
        return (node.mamba_lock_ref if self.mamba else node.full_lock_ref) > 0

    def __contains__(self, node: N) -> bool:
        return self._order.get(node.node_id) is node

    def _check_member(self, node: N) -> None:
        check_lru_node("node", node)
        if node not in self:
            raise InvalidArgumentError(f"node {node.node_id} is not in the LRU list")

    def remove(self, node: N) -> None:
        """Take ``node`` out; InvalidArgumentError (nothing changed) for a node not in it."""
        self._check_member(node)
        del self._order[node.node_id]

    def insert_mru(self, node: N) -> None:
        """Put ``node`` first; InvalidArgumentError for a non-node or a node already in."""
        check_lru_node("node", node)
        if node.node_id in self._order:
            raise InvalidArgumentError(f"node {node.node_id} already in the LRU list")
        self._order[node.node_id] = node
        self._order.move_to_end(node.node_id, last=False)

    def reset_node_mru(self, node: N) -> None:
        """Move ``node`` (in the list: InvalidArgumentError otherwise) to the front."""
        self._check_member(node)
        self._order.move_to_end(node.node_id, last=False)

    def reset_node_and_parents_mru(self, node: N, root: N) -> None:
        """Move ``node`` and its ancestors (root excluded) to the front, the node most recent
        and each ancestor just behind its child (in the mamba order only nodes with a state);
        InvalidArgumentError (nothing changed) as the reference."""
        path = [n for n in lru_path(node, root) if not self.mamba or n.mamba_value is not None]
        missing = [n.node_id for n in path if n not in self]
        if missing:
            raise InvalidArgumentError(f"nodes {missing} of the path are not in the LRU list")
        for n in reversed(path):
            self._order.move_to_end(n.node_id, last=False)

    def lru_no_lock(self, leaf_only: bool = False) -> N | None:
        """The least recently used unlocked node (``leaf_only``: unlocked leaf), or None."""
        as_bool("leaf_only", leaf_only)
        for node in reversed(self._order.values()):
            if not self._locked(node) and not (leaf_only and node.children):
                return node
        return None

    def ids(self) -> tuple[int, ...]:
        return tuple(self._order)


class MambaTreeNode:
    """One node (see the reference); ``node_id`` from the owning cache's counter."""

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
        value: torch.Tensor,
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


__all__ = ["LRUList", "MambaTreeNode"]

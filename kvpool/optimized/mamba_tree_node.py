"""``MambaTreeNode`` (optimized twin): a Mamba radix-tree node whose KV value is a tensor.

Same fields and meaning as :mod:`kvpool.reference.mamba_tree_node`, but ``value`` is an int64
slot tensor on the device (the state slot stays a host int, as the twin's Mamba slots are). The
LRU orders touch no index container, so the twin uses the reference's :class:`LRUList`.
"""

from __future__ import annotations

import torch

from kvpool.optimized.radix_key import RadixKey
from kvpool.reference.mamba_tree_node import LRUList
from kvpool.reference.radix_key import ChildKey


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

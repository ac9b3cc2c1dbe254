"""The optimized twin's ``HiTreeNode``: a tree node with the host-tier fields.

Same states and fields as :mod:`kvpool.reference.hicache.tree_node` (see its docstring): ``evicted``
(no device copy: ``value`` is an empty tensor), ``host_value`` (host slots, an int64 tensor, or
None), ``host_ref_counter`` and ``write_through_pending_id``. ``evicted`` here means "host
only", as in SGLang; the plain twin node's ``evicted`` (detached from its tree) is not used for
these nodes, whose detachment is ``parent is None``.
"""

from __future__ import annotations

import torch

from kvpool.errors import LockError
from kvpool.optimized.radix_key import RadixKey, TreeNode


class HiTreeNode(TreeNode):
    """A :class:`~kvpool.optimized.radix_key.TreeNode` plus the host-tier fields."""

    __slots__ = (
        "_host_only",
        "host_ref_counter",
        "host_value",
        "load_back_pending_id",
        "write_through_pending_id",
    )

    def __init__(
        self,
        node_id: int,
        key: RadixKey,
        value: torch.Tensor,
        parent: TreeNode | None,
        now: float,
        priority: int = 0,
    ) -> None:
        super().__init__(node_id, key, value, parent, now, priority)
        self._host_only = False
        self.host_value: torch.Tensor | None = None
        self.host_ref_counter = 0
        self.write_through_pending_id: int | None = None
        self.load_back_pending_id: int | None = None

    @property
    def evicted(self) -> bool:
        """Whether the node has no device copy (host only)."""
        return self._host_only

    @evicted.setter
    def evicted(self, value: bool) -> None:
        self._host_only = value

    @property
    def backuped(self) -> bool:
        """Whether the node has host slots (a backup, complete or in flight)."""
        return self.host_value is not None

    def protect_host(self) -> None:
        """Pin the host copy against ``evict_host``."""
        self.host_ref_counter += 1

    def release_host(self) -> None:
        """Drop one pin; LockError (nothing changed) when there is none."""
        if self.host_ref_counter <= 0:
            raise LockError(f"node {self.node_id}: host reference counter is already zero")
        self.host_ref_counter -= 1


def as_hi(node: TreeNode | None) -> HiTreeNode:
    """``node`` as a host-tier node (every node of a ``HiRadixCache`` is one)."""
    assert isinstance(node, HiTreeNode)
    return node


__all__ = ["HiTreeNode", "as_hi"]

"""``HiTreeNode``: a radix-tree node of the hierarchical cache, with a host copy beside its KV.

Units: ``value`` and ``host_value`` hold one slot per key token (device slots and host slots).

A node is in one of three places (SGLang 0.5.16's ``evicted`` / ``backuped``):

- device only: ``evicted`` False, ``host_value`` None;
- device and host: ``evicted`` False, ``host_value`` set (a backup, maybe still being written);
- host only: ``evicted`` True, ``value`` empty, ``host_value`` set; it keeps its key, so a match
  still finds it (a host hit) and ``load_back`` can restore it.

``host_ref_counter`` pins the host copy: ``evict_host`` never frees a pinned node's host slots.
``write_through_pending_id`` names the write whose acknowledgement has not arrived (None: none).
``load_back_pending_id`` (SGLang 0.5.23's unified host tier under write-back only) names the
load-back whose acknowledgement has not arrived and that pins this node's host copy against the
reclaim of host duplicates (None: none).
The root is never evicted and counts as backed up (``host_value == []``).
"""

from __future__ import annotations

from kvpool.errors import LockError
from kvpool.reference.radix_key import RadixKey, TreeNode


class HiTreeNode(TreeNode):
    """A :class:`~kvpool.reference.radix_key.TreeNode` plus the host-tier fields (see the module
    docstring)."""

    __slots__ = (
        "evicted",
        "host_ref_counter",
        "host_value",
        "load_back_pending_id",
        "write_through_pending_id",
    )

    def __init__(
        self,
        node_id: int,
        key: RadixKey,
        value: list[int],
        parent: TreeNode | None,
        now: float,
        priority: int = 0,
    ) -> None:
        super().__init__(node_id, key, value, parent, now, priority)
        self.evicted = False
        self.host_value: list[int] | None = None
        self.host_ref_counter = 0
        self.write_through_pending_id: int | None = None
        self.load_back_pending_id: int | None = None

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

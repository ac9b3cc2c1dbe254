"""``SWATreeNode``: a node of :class:`kvpool.optimized.swa.radix_cache.SWARadixCache` (its own
module so that the tree's mixins name it without an import circle)."""

from __future__ import annotations

import torch

from kvpool.optimized.radix_key import RadixKey
from kvpool.reference.radix_key import ChildKey


class SWATreeNode:
    """A node: ``key`` tokens at full slots ``value``; lock counts, tombstone flag, swa_uuid."""

    def __init__(self, node_id: int, key: RadixKey, value: torch.Tensor,
                 parent: SWATreeNode | None, now: float) -> None:  # fmt: skip
        self.node_id, self.key, self.value, self.parent = node_id, key, value, parent
        self.children: dict[ChildKey, SWATreeNode] = {}
        self.full_lock_ref = 0
        self.swa_lock_ref = 0
        self.swa_tombstone = False
        self.swa_uuid: int | None = None
        self.last_access_time = now
        # read by SGLang 0.5.23's policy-ordered full eviction (unified_swa_radix_cache)
        self.creation_time = now
        self.hit_count = 0
        self.priority = 0

    def depth(self) -> int:
        d, cur = 0, self.parent
        while cur is not None:
            d, cur = d + 1, cur.parent
        return d


__all__ = ["SWATreeNode"]

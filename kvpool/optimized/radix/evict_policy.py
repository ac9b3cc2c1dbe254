"""Eviction priority by policy name (optimized twin): the reference's key functions, shared.

The keys are pure functions of a node's plain attributes, so both twins use the very same code
and evict in exactly the same order; the optimized cache keeps these keys in a persistent heap.
"""

from __future__ import annotations

from kvpool.reference.radix.evict_policy import (
    POLICY_KEYS,
    EvictableNode,
    PriorityKey,
    get_priority_fn,
)

__all__ = ["POLICY_KEYS", "EvictableNode", "PriorityKey", "get_priority_fn"]

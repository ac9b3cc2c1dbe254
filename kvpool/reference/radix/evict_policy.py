"""Eviction priority by policy name: the smallest key is evicted first.

These are SGLang 0.5.16's strategies (``evict_policy.py``), made total: every key ends with the
node id so that the order is total (both twins must evict in exactly the same order). kvpool's
clock stamps a whole walk with one value where SGLang's reads a later time for every node it
creates, and node ids grow in creation order; so a tie on a time ascending is broken by node id
ascending, and a tie on a time descending (MRU, FILO) by node id descending, which is the order
SGLang's clock gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kvpool.constants import EVICTION_POLICIES
from kvpool.errors import ConfigError


class EvictableNode(Protocol):
    """What a policy reads of a tree node (either twin's TreeNode satisfies it)."""

    @property
    def node_id(self) -> int: ...
    @property
    def last_access_time(self) -> float: ...
    @property
    def creation_time(self) -> float: ...
    @property
    def hit_count(self) -> int: ...
    @property
    def priority(self) -> int: ...


PriorityKey = tuple[float, ...]
"""A sortable eviction key; smaller is evicted first."""


def lru_key(node: EvictableNode) -> PriorityKey:
    """Least recently used first."""
    return (node.last_access_time, node.node_id)


def lfu_key(node: EvictableNode) -> PriorityKey:
    """Fewest hits first, then least recently used."""
    return (node.hit_count, node.last_access_time, node.node_id)


def fifo_key(node: EvictableNode) -> PriorityKey:
    """Oldest created first."""
    return (node.creation_time, node.node_id)


def mru_key(node: EvictableNode) -> PriorityKey:
    """Most recently used first (on a tie, the newer node first)."""
    return (-node.last_access_time, -node.node_id)


def filo_key(node: EvictableNode) -> PriorityKey:
    """Newest created first (on a tie, the newer node first)."""
    return (-node.creation_time, -node.node_id)


def priority_key(node: EvictableNode) -> PriorityKey:
    """Lowest request priority first, then least recently used."""
    return (node.priority, node.last_access_time, node.node_id)


SLRU_PROTECTED_HITS = 2
"""SLRU: a node with at least this many hits is in the protected segment (SGLang's default)."""


def slru_key(node: EvictableNode) -> PriorityKey:
    """Segmented LRU: nodes with fewer than :data:`SLRU_PROTECTED_HITS` hits (probationary)
    before the others (protected), least recently used first within a segment."""
    return (float(node.hit_count >= SLRU_PROTECTED_HITS), node.last_access_time, node.node_id)


POLICY_KEYS: dict[str, Callable[[EvictableNode], PriorityKey]] = {
    "lru": lru_key,
    "lfu": lfu_key,
    "fifo": fifo_key,
    "mru": mru_key,
    "filo": filo_key,
    "priority": priority_key,
    "slru": slru_key,
}
assert tuple(POLICY_KEYS) == EVICTION_POLICIES


def get_priority_fn(policy: str) -> Callable[[EvictableNode], PriorityKey]:
    """The key function of ``policy``; ConfigError for an unknown name."""
    try:
        return POLICY_KEYS[policy]
    except KeyError:
        raise ConfigError(
            f"unknown eviction_policy {policy!r}; known: {EVICTION_POLICIES}"
        ) from None


__all__ = ["POLICY_KEYS", "EvictableNode", "PriorityKey", "get_priority_fn"]

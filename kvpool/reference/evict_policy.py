"""Eviction priority by policy name: the smallest key is evicted first.

Every key ends with ``node_id`` so that ties are broken by node id ascending and the order is
total (both twins must evict in exactly the same order).
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
    """Most recently used first."""
    return (-node.last_access_time, node.node_id)


def filo_key(node: EvictableNode) -> PriorityKey:
    """Newest created first."""
    return (-node.creation_time, node.node_id)


def priority_key(node: EvictableNode) -> PriorityKey:
    """Lowest request priority first, then least recently used."""
    return (node.priority, node.last_access_time, node.node_id)


POLICY_KEYS: dict[str, Callable[[EvictableNode], PriorityKey]] = {
    "lru": lru_key,
    "lfu": lfu_key,
    "fifo": fifo_key,
    "mru": mru_key,
    "filo": filo_key,
    "priority": priority_key,
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

"""Radix-tree vocabulary: ``RadixKey`` (token ids in a namespace), ``TreeNode`` and ``MatchResult``.

Units: a key's length and every index into it are tokens; a node's ``value`` lists one token slot
per key token. Page alignment is the cache's job, not the key's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import overload

from kvpool.constants import RESERVED_INDEX, is_power_of_two
from kvpool.errors import (
    IndexOutOfRangeError,
    InvalidArgumentError,
    PageSizeError,
    ReservedIndexError,
)
from kvpool.host_checks import TOKEN_ID_LIMIT, as_int, int_list

ChildKey = int | tuple[int, ...] | tuple[str | None, int | tuple[int, ...]]
"""A ``children`` dict key: the first token id (page size 1) or the tuple of the first page of
token ids (page size > 1); at the root the pair ``(extra_key, that key)`` so that namespaces never
share a node."""


class RadixKey:
    """Token ids plus an ``extra_key`` namespace (``None`` is a namespace of its own).

    ``len(key)`` counts tokens; ``key[i]`` is a token id; ``key[a:b]`` is a RadixKey with the same
    ``extra_key``. Two keys compare equal when ids and namespace both do."""

    __slots__ = ("extra_key", "token_ids")

    def __init__(self, token_ids: Sequence[int], extra_key: str | None = None) -> None:
        self.token_ids: list[int] = [int(t) for t in token_ids]
        self.extra_key = extra_key

    def __len__(self) -> int:
        return len(self.token_ids)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> RadixKey: ...

    def __getitem__(self, index: int | slice) -> int | RadixKey:
        if isinstance(index, slice):
            return RadixKey(self.token_ids[index], self.extra_key)
        return self.token_ids[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RadixKey):
            return NotImplemented
        return self.token_ids == other.token_ids and self.extra_key == other.extra_key

    __hash__ = None  # type: ignore[assignment]  # mutable list inside: not hashable

    def __repr__(self) -> str:
        return f"RadixKey({self.token_ids!r}, extra_key={self.extra_key!r})"

    def plain_child_key(self, page_size: int) -> int | tuple[int, ...]:
        """The key's first token id (page size 1) or the tuple of its first page of ids.
        PageSizeError unless ``page_size`` is a power of two (an int, not a bool);
        InvalidArgumentError for an empty key (it has no first token)."""
        check_page_size(page_size)
        if not self.token_ids:
            raise InvalidArgumentError("an empty key has no child key")
        if page_size == 1:
            return self.token_ids[0]
        return tuple(self.token_ids[:page_size])


class TreeNode:
    """One radix-tree node: ``key`` tokens cached at ``value`` slots (``len(value) == len(key)``).

    ``node_id`` comes from the owning cache's counter (root 0). ``children`` keeps insertion order
    (see :data:`ChildKey`). ``lock_ref`` counts the requests/sessions whose locked path runs through
    the node; times are the cache clock's values (``creation_time`` of the operation that created
    the node, ``last_access_time`` of the last operation that touched it)."""

    __slots__ = (
        "children",
        "creation_time",
        "hit_count",
        "key",
        "last_access_time",
        "lock_ref",
        "node_id",
        "parent",
        "priority",
        "value",
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
        self.node_id = node_id
        self.key = key
        self.value = value
        self.parent = parent
        self.children: dict[ChildKey, TreeNode] = {}
        self.lock_ref = 0
        self.last_access_time = now
        self.creation_time = now
        self.hit_count = 0
        self.priority = priority

    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.node_id}, len={len(self.key)}, lock_ref={self.lock_ref}, "
            f"children={[c.node_id for c in self.children.values()]})"
        )


@dataclass
class MatchResult:
    """What ``match_prefix`` returns. ``device_indices``: the matched slots (one per matched
    token, concatenated node values along the path). ``last_device_node``: the deepest matched
    node (the root when nothing matched; ``None`` from a chunk cache, which has no tree).
    ``last_host_node`` equals ``last_device_node`` in a plain radix cache; a ``HiRadixCache``
    reports there the deepest matched node with a host copy, and in ``host_hit_length`` the
    tokens matched in host-only nodes below ``last_device_node``."""

    device_indices: list[int]
    last_device_node: TreeNode | None
    last_host_node: TreeNode | None
    host_hit_length: int = 0


def check_page_size(page_size: object) -> int:
    """``page_size`` as an int that is a power of two (tokens): PageSizeError otherwise (a
    bool, a float, zero, a negative or a value past int64 included). Shared by both twins."""
    if type(page_size) is int and is_power_of_two(page_size) and page_size <= 2**62:
        return page_size  # the common case, without the helper's cost
    try:
        size = as_int("page_size", page_size)
    except InvalidArgumentError as exc:
        raise PageSizeError(str(exc)) from None
    if not is_power_of_two(size):
        raise PageSizeError(f"page_size must be a positive power of two, got {page_size!r}")
    return size


def tree_slot_limit(allocator: object) -> int | None:
    """One past the last slot a tree over ``allocator`` may own: ``size + page_size`` (the full
    pool's size for SWA pools); None for an allocator that states no size (a test stub)."""
    size = getattr(allocator, "size_full", getattr(allocator, "size", None))
    page_size = getattr(allocator, "page_size", None)
    if isinstance(size, int) and isinstance(page_size, int):
        return size + page_size
    return None


def check_tree_slots(values: Sequence[object], limit: int | None) -> list[int]:
    """The slots a tree node will own, checked before the tree changes: integers
    (InvalidArgumentError), then every slot >= 0 and below ``limit`` when known
    (IndexOutOfRangeError), then no reserved slot 0 (ReservedIndexError)."""
    slots = int_list("slots", values)
    bad = [s for s in slots if s < 0 or (limit is not None and s >= limit)]
    if bad:
        raise IndexOutOfRangeError(f"tree slots out of range [0, {limit}): {bad[:8]}")
    if RESERVED_INDEX in slots:
        raise ReservedIndexError(f"slot {RESERVED_INDEX} is reserved and cannot be cached")
    return slots


def bigram_codes(tokens: Sequence[int]) -> list[int]:
    """EAGLE's bigram view of ``tokens`` (SGLang's ``is_eagle`` trees): one code per adjacent
    pair, ``tokens[i] * TOKEN_ID_LIMIT + tokens[i + 1]``, ``len(tokens) - 1`` of them (none for
    fewer than two tokens). Token ids lie in ``[0, TOKEN_ID_LIMIT)``, so equal codes mean equal
    pairs and every code fits an int64. Code ``i`` stands for token ``i``'s slot: SGLang pairs a
    bigram with the slot of its first token, so the last token's slot is never cached. Shared by
    both twins and the SGLang adapters' snapshots."""
    return [a * TOKEN_ID_LIMIT + b for a, b in pairwise(tokens)]


def bigram_key(key: RadixKey) -> RadixKey:
    """``key``'s bigram key (:func:`bigram_codes`: one element fewer), in its namespace."""
    return RadixKey(bigram_codes(key.token_ids), key.extra_key)


def cached_len(num_tokens: int, page_size: int, is_eagle: bool) -> int:
    """Key elements (= slots) a tree can cache of a sequence's first ``num_tokens`` tokens:
    page-aligned, and one fewer under EAGLE's bigram keys. Shared by both twins."""
    return (max(num_tokens - is_eagle, 0) // page_size) * page_size


__all__ = [
    "ChildKey",
    "MatchResult",
    "RadixKey",
    "TreeNode",
    "bigram_codes",
    "bigram_key",
    "cached_len",
    "check_page_size",
    "check_tree_slots",
    "tree_slot_limit",
]

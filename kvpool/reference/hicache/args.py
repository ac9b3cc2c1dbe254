"""Argument checks of the host tier, shared by both twins (torch-free: they read node links,
lock counts and plain Python values only).

Every public call of the host tier runs its checks before its first change, so a refused call
(a :class:`~kvpool.errors.KVPoolError` naming the argument and the value) leaves the tree, the
host pool, the controller's queues and the request exactly as they were. The checks here cover
what the two twins check alike: a node argument is a node *of this tree* (reached from its root
through its parents, each listing it among its children), a request argument holds a row and a
lock the tree can drop, a prefetch operation or an acknowledgement is of the right class.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    LockError,
    ReservedIndexError,
)


def check_node(name: str, node: object, root: object, node_cls: type) -> None:
    """``node`` is a ``node_cls`` in the tree of ``root`` (the root itself counts):
    InvalidArgumentError for another object, a node of another tree or a detached node."""
    if not isinstance(node, node_cls):
        raise InvalidArgumentError(f"{name} must be a {node_cls.__name__}, got {node!r}")
    cur: Any = node  # a node of whichever tree class: only .parent and .children are read
    while cur is not root:
        parent = cur.parent
        if parent is None or not any(c is cur for c in parent.children.values()):
            raise InvalidArgumentError(
                f"{name}: node {getattr(node, 'node_id', '?')} is not in this tree"
            )
        cur = parent


def check_lock_holder(name: str, req: object, root: object, node_cls: type) -> None:
    """``req`` looks like a request (the fields the release path reads), holds a row, and its
    ``last_node`` (if any) is a node of this tree whose path to the root is locked, so the
    release path can drop that lock: InvalidArgumentError, or LockError for a path whose lock
    count is already zero."""
    fields = ("req_pool_idx", "last_node", "cache_protected_len", "kv_committed_len", "fill_ids")
    if any(not hasattr(req, f) for f in fields) or not hasattr(req, "all_token_ids"):
        raise InvalidArgumentError(f"{name} must be a request, got {req!r}")
    if req.req_pool_idx is None:  # type: ignore[attr-defined]
        raise InvalidArgumentError(f"request {getattr(req, 'rid', '?')!r} holds no row")
    last = req.last_node  # type: ignore[attr-defined]
    if last is None:
        return
    check_node(f"{name}.last_node", last, root, node_cls)
    cur = last
    while cur is not root:
        if cur.lock_ref <= 0:
            raise LockError(f"{name}.last_node: node {cur.node_id} holds no lock to release")
        cur = cur.parent


def check_instance(name: str, value: object, cls: type) -> None:
    """``value`` is a ``cls``: InvalidArgumentError otherwise."""
    if not isinstance(value, cls):
        raise InvalidArgumentError(f"{name} must be a {cls.__name__}, got {value!r}")


def check_span(name: str, up_to: int, low: int, high: int) -> None:
    """``low <= up_to <= high`` (tokens): InvalidArgumentError otherwise."""
    if not low <= up_to <= high:
        raise InvalidArgumentError(f"{name} must lie in [{low}, {high}], got {up_to}")


def check_host_slots(name: str, slots: list[int], host: object) -> None:
    """Host slots a transfer or a release reads: inside ``host``'s ``0..size-1``
    (IndexOutOfRangeError), each listed once and held (DoubleFreeError: a free slot holds no
    copy and a slot listed twice would be released twice)."""
    size = getattr(host, "size", None)
    if isinstance(size, int):
        bad = [h for h in slots if not 0 <= h < size]
        if bad:
            raise IndexOutOfRangeError(f"{name}: host slots {bad[:8]} outside 0..{size - 1}")
    used = getattr(host, "slot_used", None)
    twice = sorted(h for h, c in Counter(slots).items() if c > 1)
    free = [] if used is None else [h for h in slots if not bool(used[h])]
    if twice or free:
        raise DoubleFreeError(f"{name}: host slots listed twice or not held", twice + free)


def check_device_range(name: str, slots: list[int], allocator: object) -> None:
    """Device slots inside ``allocator``'s pool, ``[0, size + page_size)``
    (IndexOutOfRangeError), none the reserved slot 0 (ReservedIndexError)."""
    size = getattr(allocator, "size", None)
    page_size = getattr(allocator, "page_size", 1)
    if isinstance(size, int):
        limit = size + page_size
        bad = [s for s in slots if not 0 <= s < limit]
        if bad:
            raise IndexOutOfRangeError(f"{name}: slots {bad[:8]} outside [0, {limit})")
    if RESERVED_INDEX in slots:
        raise ReservedIndexError(f"{name}: slot {RESERVED_INDEX} is reserved")


def check_device_slots(name: str, slots: list[int], allocator: object) -> None:
    """Device slots a tree node or a transfer takes: :func:`check_device_range`, then each
    listed once and held, not free in ``allocator`` (DoubleFreeError)."""
    check_device_range(name, slots, allocator)
    page_size = getattr(allocator, "page_size", 1)
    twice = sorted(s for s, c in Counter(slots).items() if c > 1)
    free: list[int] = []
    snapshot = getattr(allocator, "snapshot", None)
    if slots and snapshot is not None:
        snap = snapshot()
        free_pages = set(snap.free_pages) | set(snap.release_pages)
        free = [s for s in slots if s // page_size in free_pages]
    if twice or free:
        raise DoubleFreeError(f"{name}: slots listed twice or not held", twice + free)


__all__ = [
    "check_device_range",
    "check_device_slots",
    "check_host_slots",
    "check_instance",
    "check_lock_holder",
    "check_node",
    "check_span",
]

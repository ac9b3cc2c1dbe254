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
from collections.abc import Iterable
from typing import Any, TypeVar, cast

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    LockError,
    ReservedIndexError,
)
from kvpool.host_checks import as_bool, as_count, as_int, int_list

_Node = TypeVar("_Node")


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


def tree_node(name: str, node: object, root: object, node_cls: type[_Node]) -> _Node:
    """``node`` as a ``node_cls`` of the tree of ``root`` (:func:`check_node`)."""
    check_node(name, node, root, node_cls)
    return cast(_Node, node)


def check_release_request(
    name: str,
    req: object,
    root: object,
    node_cls: type,
    up_to: int | None = None,
    width: int | None = None,
) -> None:
    """A request the release path may take (:func:`check_lock_holder`) and, given ``up_to``, a
    token count between its ``cache_protected_len`` and the tokens it has, capped at ``width``
    (the row's width in tokens; None: the pool states none, ``up_to`` caps itself)."""
    check_lock_holder(name, req, root, node_cls)
    if up_to is not None:
        cap = up_to if width is None else int(width)
        high = min(len(req.all_token_ids), cap)  # type: ignore[attr-defined]
        check_span("up_to", up_to, req.cache_protected_len, high)  # type: ignore[attr-defined]


def check_row_read(row_read: object, need: int) -> None:
    """A caller's read of a request's row (None: no read): integers, at least ``need`` of them
    (slots); InvalidArgumentError otherwise."""
    if row_read is not None and len(int_list("row_read", row_read)) < need:  # type: ignore[arg-type]
        raise InvalidArgumentError(f"row_read holds fewer than {need} slots: {row_read!r}")


def optional_count(name: str, value: object) -> int | None:
    """None, or ``value`` as a count (tokens or acknowledgements; ``as_count``)."""
    return None if value is None else as_count(name, value)


def insert_args(
    key: object,
    key_cls: type,
    priority: object,
    chunked: object,
    inserted_len: object,
    prev_prefix_len: object,
) -> tuple[int, bool, int | None, int]:
    """The checks ``insert`` runs on its arguments other than ``value``, in this order:
    ``key`` a ``key_cls``, ``priority`` an integer, ``chunked`` a bool, ``inserted_len`` (if
    given) and ``prev_prefix_len`` counts (tokens). Returns the last four as checked."""
    check_instance("key", key, key_cls)
    return (
        as_int("priority", priority),
        as_bool("chunked", chunked),
        optional_count("inserted_len", inserted_len),
        as_count("prev_prefix_len", prev_prefix_len),
    )


def insert_slots(
    value: Iterable[object], key_len: int, held_len: int, allocator: object | None
) -> list[int]:
    """An explicit ``value`` of ``insert`` as device slots: integers, at least one per token of
    a ``key_len``-token key (InvalidArgumentError); given ``allocator`` (a cache that is not
    disabled), its first ``held_len`` slots (the page-aligned key) pass
    :func:`check_device_slots`."""
    slots = int_list("value", value)
    if len(slots) < key_len:
        raise InvalidArgumentError(f"{len(slots)} slots for a key of {key_len} tokens")
    if allocator is not None:
        check_device_slots("value", slots[:held_len], allocator)
    return slots


def check_lockable(node: object, node_cls: type) -> None:
    """A node a lock may be taken on: a ``node_cls`` (InvalidArgumentError) with a device copy
    (LockError for a host-only node: its tokens are not on device to protect)."""
    check_instance("node", node, node_cls)
    if node.evicted:  # type: ignore[attr-defined]
        nid = node.node_id  # type: ignore[attr-defined]
        raise LockError(f"node {nid} is host-only: nothing on device to lock")


def backup_args(
    node: object, write_back: object, root: object, node_cls: type[_Node]
) -> tuple[_Node, bool]:
    """``write_backup``'s arguments, in this order: ``node`` a node of this tree
    (:func:`check_node`), ``write_back`` a bool, then ``node`` not the root, on device and not
    backed up yet (InvalidArgumentError: a second backup would leak the first's host slots)."""
    out = tree_node("node", node, root, node_cls)
    flag = as_bool("write_back", write_back)
    cur: Any = out  # a host-tier node of either twin: .evicted and .backuped are read
    if cur is root or cur.evicted or cur.backuped:
        raise InvalidArgumentError(
            f"node {cur.node_id} is the root, host-only or backed up already"
        )
    return out, flag


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


def check_device_slots(
    name: str, slots: list[int], allocator: object, not_held: list[int] | None = None
) -> None:
    """Device slots a tree node or a transfer takes: :func:`check_device_range`, then each
    listed once and held, not free in ``allocator`` (DoubleFreeError). ``not_held``: the
    listed slots on free pages when the caller has already found them (the twin, from its
    free-page mask); else :func:`slots_not_held` finds them."""
    check_device_range(name, slots, allocator)
    twice = sorted(s for s, c in Counter(slots).items() if c > 1)
    free = slots_not_held(slots, allocator) if not_held is None else not_held
    if twice or free:
        raise DoubleFreeError(f"{name}: slots listed twice or not held", twice + free)


def slots_not_held(slots: list[int], allocator: object) -> list[int]:
    """The ``slots`` that lie on a free (or staged) page of ``allocator``: from its free-page
    set when it keeps one (the reference's allocators: one lookup per slot), else from its
    snapshot (an injected allocator; no snapshot: none)."""
    if not slots:
        return []
    page_size = getattr(allocator, "page_size", 1)
    free_pages = getattr(allocator, "_free_set", None)
    if free_pages is None:
        snapshot = getattr(allocator, "snapshot", None)
        if snapshot is None:
            return []
        snap = snapshot()
        free_pages = set(snap.free_pages) | set(snap.release_pages)
    return [s for s in slots if s // page_size in free_pages]


__all__ = [
    "backup_args",
    "check_device_range",
    "check_device_slots",
    "check_host_slots",
    "check_instance",
    "check_lock_holder",
    "check_lockable",
    "check_node",
    "check_release_request",
    "check_row_read",
    "check_span",
    "insert_args",
    "insert_slots",
    "optional_count",
    "slots_not_held",
    "tree_node",
]
